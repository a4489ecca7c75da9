"""The web dashboard: pages rendered on the server from the REST API, kept live by polling.

`install(app)` adds the pages at /, the login at /login and the static files at /ui/static.
"""

from fastapi import FastAPI

from corral.api.routes import serve
from corral.dashboard import routes, workspaces

__all__ = ["install"]


def install(app: FastAPI) -> None:
    """Serve the dashboard from `app`: pages at /, their scripts' API bridge at /ui/api,
    and the workspace pages (which build on the pages' login, never the other way)."""
    serve(app, routes.router)
    serve(app, workspaces.router)
