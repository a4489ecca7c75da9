"""The methods a path allows (`Allow`): the answer to OPTIONS, and the header of a 405."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

# The methods probed: a route answers FULL for those it has (HEAD goes with GET).
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """The methods the routes that match the request's path allow, sorted, with HEAD (when
    GET is one) and OPTIONS; none when no route matches the path."""
    allowed: set[str] = set()
    for method in METHODS:
        # One copy of the request's scope per method, not per route (matching reads it).
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in routes):
            allowed.add(method)
    if not allowed:
        return []
    if "GET" in allowed:
        allowed.add("HEAD")
    allowed.add("OPTIONS")
    return sorted(allowed)


class AllowedMethods:
    """Answer OPTIONS with 204 and `Allow` listing the methods of the routes that match
    the path (404 when none does), before authentication: it reveals only the API's
    shape, which the OpenAPI document publishes anyway."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        # The application's own list, which `corral.api.routes.serve` fills after this is made.
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        allowed = allowed_methods(self.routes, scope)
        response: Response
        if not allowed:
            response = JSONResponse({"detail": "Not Found"}, status_code=404)
        else:
            response = Response(status_code=204, headers={"Allow": ", ".join(allowed)})
        await response(scope, receive, send)
