"""How the application takes the routes of its routers (the API's resources, telemetry,
the documentation, the dashboard, the workspace proxy and the terminal bridge), and the
route class they are made with."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette._utils import get_route_path
from starlette.routing import Match
from starlette.types import Scope


class PrefixedRoute(APIRoute):
    """An APIRoute that turns away a request for a path outside its fixed start (the path
    up to its first parameter) before FastAPI and Starlette match it.

    A request is offered to the routes in their order until one matches: one for the
    workspace proxy (the last routes) asks some 70 of them, at about 2 us each on a 2-core
    machine (FastAPI looks for an included router's context, Starlette works out the
    route path and runs the regular expression), where a string comparison costs a tenth
    of that. The answer is the same: a path that does not start with the fixed part of
    the route's pattern cannot match it. Only for routes taken flat by `serve` (no
    included router, which would match the path with its prefix)."""

    def __init__(self, path: str, endpoint: Any, **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.fixed = path.split("{", 1)[0]

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and not get_route_path(scope).startswith(self.fixed):
            return Match.NONE, {}
        return super().matches(scope)


def serve(app: FastAPI, router: APIRouter) -> None:
    """Add the routes of `router` to the application's own list, as the router made them
    (with its prefix, tags and error responses), after those it has.

    `app.include_router` would keep the router as one nested route (FastAPI 0.165): a
    request walks the routers before its own, each matched through its effective view,
    and the chosen one is matched again to hand the request on, which costs the routes
    behind many routers most (GET /healthz is behind every API router). The routers
    here are taken as they are, with nothing of the inclusion's own (no prefix, tags,
    dependencies or overrides), so the nesting buys nothing. Their routes are all made
    when their modules are imported, before this is called, each a `PrefixedRoute` (made with
    `APIRouter(route_class=PrefixedRoute)`): a router of plain APIRoutes is refused, since every
    request to a route behind them would pay for their matching in full."""
    for route in router.routes:
        if isinstance(route, APIRoute) and not isinstance(route, PrefixedRoute):
            raise TypeError(
                f"{route.path}: make its router with APIRouter(route_class=PrefixedRoute)"
            )
    app.router.routes.extend(router.routes)
