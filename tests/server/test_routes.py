"""The application's routes match requests as FastAPI's own would: `PrefixedRoute` turns a
path away early only where `APIRoute.matches` would not match it either."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Match

from corral.api.routes import PrefixedRoute, serve
from corral.server.app import create_app
from corral.store import Store

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    path = tmp_path_factory.mktemp("routes") / "corral.db"
    return create_app(Store(f"sqlite:///{path}"), run_scheduler=False)


def paths_to_try(routes: list[PrefixedRoute]) -> set[str]:
    """Every route's path with its parameters filled in, and near misses of each: a
    trailing slash, one segment more or less, a prefix cut short, a neighbour's start."""
    paths = {"/", "", "/api", "/api/v1", "/api/v1/", "/w", "/w/", "/ui/api/", "//api/v1/queues"}
    for route in routes:
        filled = re.sub(r"\{[^}:]+(:path)?\}", lambda m: "a/b" if m.group(1) else "x", route.path)
        cut = route.fixed.rstrip("/")
        paths |= {filled, filled + "/", filled + "/more", filled.rsplit("/", 1)[0], cut, cut[:-1]}
        paths |= {route.fixed, route.fixed + "%2F", filled.upper(), filled.replace("/", "//")}
    return paths


def test_every_http_route_of_the_application_is_a_prefixed_route(app: FastAPI) -> None:
    kinds = {type(route).__name__ for route in app.router.routes if isinstance(route, APIRoute)}
    assert kinds == {"PrefixedRoute"}


def test_prefixed_routes_match_every_request_as_api_routes_do(app: FastAPI) -> None:
    routes = [route for route in app.router.routes if isinstance(route, PrefixedRoute)]
    assert len(routes) > 50
    paths = paths_to_try(routes)
    turned_away = 0
    for route, path, method, root_path in itertools.product(
        routes, sorted(paths), METHODS, ("", "/corral")
    ):
        full = root_path + path if root_path else path
        scope = {"type": "http", "method": method, "path": full, "root_path": root_path}
        ours = route.matches(dict(scope))
        theirs = APIRoute.matches(route, dict(scope))
        assert ours == theirs, (route.path, path, method, root_path)
        turned_away += ours[0] == Match.NONE
    # The comparison covered matches as well as misses.
    assert 0 < turned_away < len(routes) * len(paths) * len(METHODS) * 2


def test_a_websocket_request_is_left_to_the_route(app: FastAPI) -> None:
    route = next(r for r in app.router.routes if isinstance(r, PrefixedRoute))
    scope = {"type": "websocket", "path": "/nowhere", "root_path": ""}
    assert route.matches(dict(scope)) == APIRoute.matches(route, dict(scope))


def test_a_router_of_plain_api_routes_is_refused_by_its_path(tmp_path: Path) -> None:
    plain = APIRouter()

    @plain.get("/plain")
    def handler() -> None: ...

    with pytest.raises(TypeError, match="/plain: make its router with"):
        serve(FastAPI(), plain)
