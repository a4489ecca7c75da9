"""How the application takes the routes of its routers (the API's resources, telemetry,
the documentation, the dashboard, the workspace proxy and the terminal bridge)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI


def serve(app: FastAPI, router: APIRouter) -> None:
    """Add the routes of `router` to the application's own list, as the router made them
    (with its prefix, tags and error responses), after those it has.

    `app.include_router` would keep the router as one nested route (FastAPI 0.165): a
    request walks the routers before its own, each matched through its effective view,
    and the chosen one is matched again to hand the request on, which costs the routes
    behind many routers most (GET /healthz is behind every API router). The routers
    here are taken as they are, with nothing of the inclusion's own (no prefix, tags,
    dependencies or overrides), so the nesting buys nothing. Their routes are all made
    when their modules are imported, before this is called."""
    app.router.routes.extend(router.routes)
