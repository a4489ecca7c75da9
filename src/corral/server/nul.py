"""Requests with a NUL character in their path or query are refused before any handler.

No name, filter or value corral stores may hold one (PostgreSQL cannot store it in text,
and SQLite would keep a string that nothing else can match), so a NUL in a URL is always
bad input: 422 naming the parameter, never a store error turned into a 500.
"""

from __future__ import annotations

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
