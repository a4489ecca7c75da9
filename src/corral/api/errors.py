"""How the API answers errors: the documented error responses, the exceptions the handlers
raise for 401 and 403, and the handlers that turn every error into `{"detail": ...}`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.api.options import allowed_methods
from corral.api.schemas.common import ErrorOut
from corral.store import Conflict, Invalid, NotFound

log = logging.getLogger("corral.server")

# The error responses every endpoint of the API documents.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "the body is not valid JSON"},
    401: {"model": ErrorOut, "description": "no token, or a token that is not valid"},
    403: {"model": ErrorOut, "description": "the token's role does not allow this"},
    404: {"model": ErrorOut, "description": "no such object"},
    409: {"model": ErrorOut, "description": "conflicts with the current state"},
    413: {"model": ErrorOut, "description": "body larger than 1 MiB"},
    429: {"model": ErrorOut, "description": "too many writes with this token; see Retry-After"},
}


class Unauthorized(Exception):
    """No token, or a token that is not valid: answered with 401."""


class Forbidden(Exception):
    """The token's role does not allow this: answered with 403."""


def flatten_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic's errors with the names of union alternatives taken out of `loc`.

    A field that accepts several shapes ("deserved": a number or a map) gets one error per
    shape, each under a tag like "constrained-float". A client wants the field's path and
    what was wrong with the shape it sent: the alternatives of that shape are kept, and
    only when none matches are all of them listed."""
    groups: dict[tuple[Any, ...], list[tuple[str | None, Any]]] = {}
    for item in errors:
        tags = [part for part in item["loc"] if _is_tag(part)]
        loc = tuple(part for part in item["loc"] if not _is_tag(part))
        groups.setdefault(loc, []).append((tags[-1] if tags else None, item))
    flat = []
    for loc, items in groups.items():
        sent = _shape(items[0][1].get("input"))
        meant = [item for tag, item in items if tag is None or _tag_shape(tag) == sent]
        chosen = meant or [item for _, item in items]
        messages = list(dict.fromkeys(item["msg"] for item in chosen))
        flat.append({"loc": list(loc), "msg": "; or ".join(messages), "type": chosen[0]["type"]})
    return flat


def _is_tag(part: Any) -> bool:
    if not isinstance(part, str):
        return False
    return (
        part in {"int", "str", "float", "bool", "dict", "list"}
        or any(c in part for c in "-[")
        or part[:1].isupper()
    )


def _shape(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "map" if isinstance(value, dict) else "other"


def _tag_shape(tag: str) -> str:
    if tag == "str" or tag.startswith("constrained-str"):
        return "str"
    if tag == "bool":
        return "bool"
    if tag in {"int", "float"} or tag.startswith(("constrained-int", "constrained-float")):
        return "number"
    if tag.startswith("list"):
        return "list"
    return "map"


def install_error_handlers(app: FastAPI) -> None:
    """Answer the store's errors, 401, 403, invalid bodies and unexpected failures with
    `{"detail": ...}` and the right status."""

    def handler(
        status: int, headers: dict[str, str] | None = None
    ) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def respond(_request: Request, error: Exception) -> JSONResponse:
            return JSONResponse({"detail": str(error)}, status_code=status, headers=headers)

        return respond

    app.add_exception_handler(NotFound, handler(404))
    app.add_exception_handler(Conflict, handler(409))
    app.add_exception_handler(Unauthorized, handler(401, {"WWW-Authenticate": "Bearer"}))
    app.add_exception_handler(Forbidden, handler(403))

    async def invalid(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, Invalid)
        loc = ["body", *error.at, error.field]
        detail = [{"loc": loc, "msg": error.message, "type": "value_error"}]
        return JSONResponse({"detail": detail}, status_code=422)

    app.add_exception_handler(Invalid, invalid)

    async def validation(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return JSONResponse({"detail": flatten_errors(error.errors())}, status_code=422)

    app.add_exception_handler(RequestValidationError, validation)

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        headers = error.headers
        # Starlette names only the methods of the first route of the path; each method of
        # a path is a route of its own here.
        if error.status_code == 405 and (
            allowed := allowed_methods(request.app.router.routes, request.scope)
        ):
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        return JSONResponse(
            {"detail": str(error.detail)}, status_code=error.status_code, headers=headers
        )

    app.add_exception_handler(StarletteHTTPException, http_error)

    async def unexpected(_request: Request, error: Exception) -> JSONResponse:
        # The traceback goes to the server's log, never to the client.
        log.error("unhandled error", exc_info=error)
        return JSONResponse({"detail": "internal error; see the server log"}, status_code=500)

    app.add_exception_handler(Exception, unexpected)
