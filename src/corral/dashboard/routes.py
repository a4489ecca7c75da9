"""The dashboard's routes: the login, the pages, the cookie-to-bearer bridge to the API for
the pages' scripts, and the static files (Plotly's bundle from the installed package)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import plotly
from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

import corral.dashboard.pages as pages
import corral.dashboard.views as views
from corral.api.routes import PrefixedRoute
from corral.dashboard.apiclient import ApiClient, ApiError, together

HERE = Path(__file__).parent
STATIC = HERE / "static"
PLOTLY = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
PLOTLY_NAME = f"plotly-{plotly.__version__}.min.js"
COOKIE = "corral_token"
OWN_STATIC = {
    "dashboard.css": "text/css",
    "dashboard.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
POLL_MS = 3000
PAGE_PATHS = {
    "/": "overview",
    "/queues": "queues",
    "/workloads": "workloads",
    "/nodes": "nodes",
    "/usage": "usage",
    "/workspaces": "workspaces",
}
SECURITY_HEADERS = {
    # Plotly adds <style> elements of its own; no script runs but our files.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def safe_next(value: str | None) -> str:
    """Where to go after logging in: a path on this site only."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def _fingerprint(names: list[str]) -> str:
    digest = hashlib.sha256()
    for name in names:
        digest.update((STATIC / name).read_bytes())
    return digest.hexdigest()[:12]


templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters.update(
    num=views.num,
    hours=views.hours,
    pct=views.pct,
    duration=views.duration,
    gib=views.gib,
    clock=views.clock,
    command=views.command,
    workload_url=views.workload_url,
)
templates.env.globals.update(
    views=views,
    plotly_js=f"/ui/static/{PLOTLY_NAME}",
    static_version=_fingerprint(sorted(OWN_STATIC)),
    poll_ms=POLL_MS,
)
router = APIRouter(include_in_schema=False, route_class=PrefixedRoute)


def to_login(request: Request, clear: bool = False) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    response = RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    if clear:
        response.delete_cookie(COOKIE, path="/")
    return response


def page_response(
    request: Request, template: str, context: dict[str, Any], status: int = 200
) -> Response:
    return templates.TemplateResponse(
        request, template, context, status_code=status, headers=SECURITY_HEADERS
    )


async def render(
    request: Request,
    page: str,
    load: Callable[[ApiClient], Coroutine[Any, Any, dict[str, Any]]],
) -> Response:
    token = request.cookies.get(COOKIE)
    if not token:
        return to_login(request)
    async with ApiClient(request.app, token) as api:
        try:
            me, data = await together(api.get("/whoami"), load(api))
        except ApiError as error:
            if error.status == 401:
                return to_login(request, clear=True)
            return page_response(
                request,
                "error.html",
                {"page": page, "me": None, "status": error.status, "detail": error.detail},
                error.status,
            )
    context = {"page": page, "me": me, "data": data, "now": time.time()}
    return page_response(request, f"{page}.html", context)


def same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")


# -- login -----------------------------------------------------------------------------


@router.get("/login")
def login_page(request: Request, next: str = "/", error: str = "") -> Response:
    context = {"page": "login", "me": None, "next": safe_next(next), "error": error}
    return page_response(request, "login.html", context)


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return JSONResponse({"detail": "cross-site login refused"}, status_code=403)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    target = safe_next((form.get("next") or ["/"])[0])
    valid = False
    if token:
        async with ApiClient(request.app, token) as api:
            valid = (await api.raw("/whoami")).status_code == 200
    if not valid:
        # Back to the form with a message (a redirect, so that a reload does not post).
        return RedirectResponse(
            f"/login?error=invalid&next={quote(target, safe='')}", status_code=303
        )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    if not same_origin(request):
        return JSONResponse({"detail": "cross-site logout refused"}, status_code=403)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# -- pages -----------------------------------------------------------------------------


def show(page: str) -> Callable[[Request], Awaitable[Response]]:
    load = pages.PAGES[page]

    async def endpoint(request: Request) -> Response:
        return await render(request, page, lambda api: load(api, request.query_params))

    return endpoint


for path, page in PAGE_PATHS.items():
    router.add_api_route(path, show(page), methods=["GET"])


@router.get("/workloads/{name}")
async def workload(request: Request, name: str) -> Response:
    return await render(
        request, "workload", lambda api: pages.workload(api, request.query_params, name)
    )


# -- the API, for the pages' scripts ---------------------------------------------------


@router.get("/ui/api/{path:path}")
async def bridge(request: Request, path: str) -> Response:
    """GET /ui/api/X is GET /api/v1/X with the token of the login cookie."""
    token = request.cookies.get(COOKIE)
    if not token:
        return JSONResponse({"detail": "not logged in"}, status_code=401)
    if any(part in ("", ".", "..") for part in path.split("/")):
        return JSONResponse({"detail": "no such path"}, status_code=404)
    async with ApiClient(request.app, token) as api:
        upstream = await api.raw(f"/{path}", httpx.QueryParams(request.url.query))
    headers = {"Cache-Control": "no-store"}
    if "content-type" in upstream.headers:
        headers["Content-Type"] = upstream.headers["content-type"]
    return Response(upstream.content, status_code=upstream.status_code, headers=headers)


# -- static files ----------------------------------------------------------------------


@router.get("/ui/static/{name}")
def static(name: str) -> Response:
    if name in OWN_STATIC:
        return FileResponse(
            STATIC / name, media_type=OWN_STATIC[name], headers={"Cache-Control": "no-cache"}
        )
    if name == PLOTLY_NAME:
        # Named by version, so it may be cached for good.
        return FileResponse(
            PLOTLY,
            media_type="text/javascript",
            headers={"Cache-Control": "public, max-age=31536000, immutable"},
        )
    return JSONResponse({"detail": "no such file"}, status_code=404)
