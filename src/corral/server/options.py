"""OPTIONS requests: answered for every route with the methods it allows (`Allow`)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send


class AllowedMethods:
    """Answer OPTIONS with 204 and `Allow` listing the methods of the routes that match
    the path (404 when none does), before authentication: it reveals only the API's
    shape, which the OpenAPI document publishes anyway."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        # The application's own list, which `include_router` fills after this is made.
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        allowed: set[str] = set()
        for route in self.routes:
            methods = getattr(route, "methods", None)
            if methods is None:
                continue
            # A GET probe: any route whose path matches answers FULL or PARTIAL.
            match, _ = route.matches({**scope, "method": "GET"})
            if match != Match.NONE:
                allowed.update(methods)
        response: Response
        if not allowed:
            response = JSONResponse({"detail": "Not Found"}, status_code=404)
        else:
            if "GET" in allowed:
                allowed.add("HEAD")
            allowed.add("OPTIONS")
            response = Response(status_code=204, headers={"Allow": ", ".join(sorted(allowed))})
        await response(scope, receive, send)
