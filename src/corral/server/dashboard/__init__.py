"""The web dashboard: pages rendered on the server from the REST API, kept live by polling.

`install(app)` adds the pages at /, the login at /login and the static files at /ui/static.
"""

from corral.server.dashboard.routes import install

__all__ = ["install"]
