"""OPTIONS requests: answered for every route with the methods it allows (`Allow`)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

# The methods probed: a route answers FULL for those it has (HEAD goes with GET).
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


class AllowedMethods:
    """Answer OPTIONS with 204 and `Allow` listing the methods of the routes that match
    the path (404 when none does), before authentication: it reveals only the API's
    shape, which the OpenAPI document publishes anyway."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        # The application's own list, which `corral.server.routes.serve` fills after this is made.
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        allowed = {
            method
            for method in METHODS
            if any(
                route.matches({**scope, "method": method})[0] == Match.FULL for route in self.routes
            )
        }
        response: Response
        if not allowed:
            response = JSONResponse({"detail": "Not Found"}, status_code=404)
        else:
            if "GET" in allowed:
                allowed.add("HEAD")
            allowed.add("OPTIONS")
            response = Response(status_code=204, headers={"Allow": ", ".join(sorted(allowed))})
        await response(scope, receive, send)
