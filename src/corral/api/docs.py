"""The API's interactive documentation at /docs (and /api/v1/docs): Swagger UI, served from
this server, so that it works without the Internet and under a content security policy
that runs no script but the server's own files.

FastAPI's own page loads Swagger UI from a CDN and starts it with an inline script; this
one takes Swagger UI's files from the `fastapi-offline` package and starts it from a file.
The page and the OpenAPI document need no token; trying a call does, given with the
page's Authorize button (a bearer token), and is answered as any other API call.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from corral.api.deps import API
from corral.api.routes import PrefixedRoute, serve

DOCS = f"{API}/docs"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}
# Swagger UI sets styles inline and draws icons from data: URLs; scripts are ours only.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
START = f"""window.addEventListener("load", function () {{
  window.ui = SwaggerUIBundle({{
    url: "{API}/openapi.json",
    dom_id: "#swagger-ui",
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
    layout: "BaseLayout",
    deepLinking: true,
    persistAuthorization: false
  }});
}});
"""
PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>corral API</title>
<link rel="icon" href="{DOCS}/assets/favicon.png">
<link rel="stylesheet" href="{DOCS}/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{DOCS}/assets/swagger-ui-bundle.js"></script>
<script src="{DOCS}/assets/start.js"></script>
</body>
</html>
"""

router = APIRouter(include_in_schema=False, route_class=PrefixedRoute)


@router.get("/docs")
def docs_redirect() -> RedirectResponse:
    """/docs, where FastAPI users look, is the API's own page."""
    return RedirectResponse(DOCS, status_code=307)


@router.get(DOCS)
def docs_page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers=HEADERS)


@router.get(f"{DOCS}/assets/{{name}}")
def docs_asset(name: str) -> Response:
    if name == "start.js":
        return Response(START, media_type="text/javascript", headers=HEADERS)
    if name not in ASSETS:
        raise HTTPException(404, "not found")
    content = (files("fastapi_offline") / "static" / name).read_bytes()
    # The files change only with the package: a browser may keep them for a day.
    headers = {**HEADERS, "Cache-Control": "public, max-age=86400"}
    return Response(content, media_type=ASSETS[name], headers=headers)


def install_api_docs(app: FastAPI) -> None:
    """Serve the interactive documentation (FastAPI's own docs_url must be None)."""
    serve(app, router)
