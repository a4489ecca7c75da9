"""Requests with a NUL character in their path or query are refused before any handler,
and so are JSON bodies with a NUL or a lone surrogate in any string (`body_problem`).

No name, filter or value corral stores may hold one (PostgreSQL cannot store it in text,
and SQLite would keep a string that nothing else can match), so a NUL in a URL is always
bad input: 422 naming the parameter, never a store error turned into a 500. A lone
surrogate (`"\\ud800"`, half of a UTF-16 pair) is valid JSON but no character: it cannot
be stored or sent on as UTF-8 either, in a command, a label or a selector alike.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send


class RefuseNul:
    """422 for a NUL in the path or in any query parameter's name or value."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            where = _nul_in(scope)
            if where is not None:
                if scope["type"] == "websocket":
                    # Refused before the handshake is accepted: a 403 to the client.
                    await send({"type": "websocket.close", "code": 1008})
                    return
                detail = [{"loc": where, "msg": "must not contain NUL", "type": "value_error"}]
                await JSONResponse({"detail": detail}, status_code=422)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# How a NUL or a surrogate is written in JSON (it has no other way in: JSON refuses raw
# control characters in strings, and UTF-8 cannot encode a surrogate). Only a body with
# one of these is parsed here; any other goes to the app as it is.
_ESCAPED = re.compile(rb"\\u(?:0000|d[89a-f][0-9a-f]{2})", re.IGNORECASE)


def body_problem(body: bytes) -> dict[str, Any] | None:
    """The 422 detail of a JSON body with a NUL or a lone surrogate in a string (a key or
    a value), naming where; None when it has neither, or is no JSON (the app says so)."""
    if not _ESCAPED.search(body):
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    found = _bad_string(value, ["body"])
    if found is None:
        return None
    where, message = found
    return {"loc": where, "msg": message, "type": "value_error"}


def _bad_string(value: Any, where: list[str | int]) -> tuple[list[str | int], str] | None:
    if isinstance(value, str):
        if "\x00" in value:
            return where, "must not contain NUL"
        if any("\ud800" <= char <= "\udfff" for char in value):
            return where, "must not contain a lone surrogate (half of a UTF-16 pair)"
        return None
    items: list[tuple[str | int, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found = _bad_string(key, [*where, key])
            if found is not None:
                return found
            items.append((key, item))
    elif isinstance(value, list):
        items = list(enumerate(value))
    for key, item in items:
        found = _bad_string(item, [*where, key])
        if found is not None:
            return found
    return None


def _nul_in(scope: Scope) -> list[str] | None:
    """Where a NUL is: ["path"] or ["query", NAME]; None when there is none."""
    if "\x00" in scope.get("path", ""):  # decoded already: %00 is a NUL here
        return ["path"]
    query = scope.get("query_string", b"").decode("latin-1")
    if "%00" not in query.lower() and "\x00" not in query:
        return None
    for name, value in parse_qsl(query, keep_blank_values=True):
        if "\x00" in name:
            return ["query"]
        if "\x00" in value:
            return ["query", name]
    return None
