"""The workspace proxy: /w/WORKLOAD/... to the `main` port of its task, /w/WORKLOAD/PORT/...
to its other ports, HTTP and WebSocket, for its owner, its project's project-admins and
admins only (corral.workspaces.access.check_access).

Bodies stream through in chunks, with the ASGI server's flow control: a slow client makes
this request wait for it, never the event loop, and nothing is buffered beyond a chunk
(request bodies are capped at 1 MiB by corral.api.body_limit). The login cookie and
the Authorization header are never passed on: the workload must not learn a user's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from functools import partial
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import quote

import httpx
import websockets
from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect

from corral.api.routes import PrefixedRoute, serve
from corral.store import Store
from corral.workspaces.access import (
    COOKIE,
    Refused,
    Route,
    Watch,
    authenticate,
    credentials,
    forget_target,
    keyed,
    route,
    same_origin,
    while_allowed,
)
from corral.workspaces.origins import (
    SCOPE_KEY,
    SESSION_COOKIE,
    WorkspaceHosts,
    WorkspaceOrigins,
)

log = logging.getLogger("corral.proxy")

# Headers of one hop only (RFC 9110 7.6.1), and those the proxy sets itself.
HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "cookie",
    "content-length",
}
WS_SKIP = HOP | {
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
    "sec-websocket-accept",
    "origin",
}
# A WebSocket message larger than this closes the connection (1009); at most QUEUE
# messages wait in each direction.
WS_MAX_MESSAGE = 16 << 20
WS_QUEUE = 16
# How often a workload's last activity is written to the store, at most.
ACTIVITY_EVERY = 10.0

router = APIRouter(include_in_schema=False, route_class=PrefixedRoute)
# corral's cookies, never passed to a workload nor set by one.
OURS = (COOKIE, SESSION_COOKIE)


def _credentials(connection: HTTPConnection) -> tuple[str | None, bool]:
    """The token of a request, and whether a cookie carried it: on the server's host the
    login cookie, on a workspace's own host that host's session cookie (see
    corral.workspaces.origins); a bearer token on either."""
    workload = connection.scope.get(SCOPE_KEY)
    if workload is None:
        return credentials(connection.headers, connection.cookies)
    token, _ = credentials(connection.headers, {})
    if token:
        return token, False
    origins: WorkspaceOrigins = connection.app.state.workspace_origins
    found = origins.session_token(connection.cookies.get(SESSION_COOKIE), workload)
    return found, found is not None


def _elsewhere(connection: HTTPConnection, by_cookie: bool) -> WorkspaceOrigins | None:
    """The workspace domain, when a browser (its cookie) asks the server's host for a
    workspace that has an origin of its own."""
    origins: WorkspaceOrigins | None = connection.app.state.workspace_origins
    if origins is None or not by_cookie or SCOPE_KEY in connection.scope:
        return None
    return origins


class Activity:
    """When the proxy last carried each workload's traffic, written to the store at most
    every ACTIVITY_EVERY seconds per workload (idle detection counts it)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._written: dict[str, float] = {}

    async def touch(self, workload: str) -> None:
        now = time.time()
        if now - self._written.get(workload, 0.0) < ACTIVITY_EVERY:
            return
        self._written[workload] = now
        try:
            await run_in_threadpool(self.store.mark_active, [workload], now)
        except Exception:
            log.exception("recording the activity of %s failed", workload)


def _store(app: FastAPI) -> Store:
    store: Store = app.state.store
    return store


def _refusal(error: Refused, request: Request, from_browser: bool) -> Response:
    # A workspace's own host has no login page: its users come from the server's host.
    if error.status == 401 and from_browser and SCOPE_KEY not in request.scope:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    return JSONResponse({"detail": error.detail}, status_code=error.status)


def _browser(request: Request) -> bool:
    return request.method == "GET" and "text/html" in request.headers.get("accept", "")


def _upstream_cookies(header: str | None) -> str | None:
    """The request's cookies without corral's own."""
    if not header:
        return None
    kept = [
        part.strip()
        for part in header.split(";")
        if part.strip() and part.strip().split("=", 1)[0].strip() not in OURS
    ]
    return "; ".join(kept) or None


def _sets_our_cookie(value: str) -> bool:
    """True for a Set-Cookie of the workload's that would replace corral's login."""
    parsed: SimpleCookie = SimpleCookie()
    try:
        parsed.load(value)
    except Exception:
        # What we cannot read we do not pass on.
        return True
    return any(name in parsed for name in OURS)


def _response_headers(upstream: httpx.Response, target: Route) -> list[tuple[str, str]]:
    headers = []
    for key, value in upstream.headers.multi_items():
        lower = key.lower()
        if lower in HOP - {"content-length"}:
            continue
        if lower == "set-cookie" and _sets_our_cookie(value):
            continue
        if (
            lower == "location"
            and target.strip
            and value.startswith("/")
            and not (value.startswith("//"))
        ):
            # A program that does not know its prefix redirects within its own root.
            value = target.strip.rstrip("/") + value
        headers.append((key, value))
    return headers


async def proxy_http(request: Request, name: str, rest: str) -> Response:
    """One HTTP request through to the workload's port, streamed both ways."""
    store = _store(request.app)
    token, by_cookie = _credentials(request)
    try:
        user = await authenticate(store, token)
        request.state.user = user
        if by_cookie and not same_origin(request.headers):
            raise Refused(403, "cross-site request refused")
        name, rest, bare = await keyed(store, name, rest)
        if bare:  # /w/PROJECT/NAME is /w/PROJECT/NAME/
            return RedirectResponse(f"/w/{name}/", status_code=307)
        target, path = await route(store, user, name, rest, request.scope.get("raw_path"))
        origins = _elsewhere(request, by_cookie)
        if origins is not None and request.method not in ("GET", "HEAD"):
            raise Refused(403, f"workspace {name} is served at its own origin only")
    except Refused as error:
        return _refusal(error, request, _browser(request))
    if origins is not None:
        assert token is not None
        wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        entry = origins.entry_url(
            request.headers.get("host", ""),
            request.url.scheme,
            token,
            name,
            target.target.id,
            wanted,
        )
        return origins.handoff(entry)
    await request.app.state.activity.touch(target.target.workload)
    headers = [(key, value) for key, value in request.headers.items() if key.lower() not in HOP]
    cookies = _upstream_cookies(request.headers.get("cookie"))
    if cookies:
        headers.append(("cookie", cookies))
    headers.append(("x-forwarded-host", request.headers.get("host", "")))
    headers.append(("x-forwarded-proto", request.url.scheme))
    url = f"http://{target.host}:{target.number}{path}"
    client: httpx.AsyncClient = request.app.state.proxy_client
    body = await request.body()
    upstream_request = client.build_request(
        request.method,
        url,
        params=request.url.query or None,
        headers=headers,
        content=body,
    )
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as error:
        # Perhaps it moved or stopped: look it up afresh next time.
        forget_target(store, name)
        detail = f"workload {name} does not answer on its port {target.port.name}: {error}"
        return JSONResponse({"detail": detail}, status_code=502)
    return _streaming(upstream, name, target)


def _streaming(upstream: httpx.Response, name: str, target: Route) -> Response:
    response = StreamingResponse(
        _chunks(upstream, name),
        status_code=upstream.status_code,
        background=BackgroundTask(upstream.aclose),
    )
    # Multiple Set-Cookie headers must survive: set the raw list.
    response.raw_headers = [
        (key.lower().encode("latin-1"), value.encode("latin-1"))
        for key, value in _response_headers(upstream, target)
    ]
    return response


async def _chunks(upstream: httpx.Response, name: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.HTTPError as error:
        # The workload went away mid-answer: the client sees a truncated body.
        log.info("the answer of %s broke off: %s", name, error)


async def proxy_websocket(websocket: WebSocket, name: str, rest: str) -> None:
    """A WebSocket through to the workload's port: messages relayed both ways until one
    side closes."""
    store = _store(websocket.app)
    token, by_cookie = _credentials(websocket)
    try:
        user = await authenticate(store, token)
        if not same_origin(websocket.headers):
            raise Refused(403, "cross-site WebSocket refused")
        if _elsewhere(websocket, by_cookie) is not None:
            raise Refused(403, f"workspace {name} is served at its own origin only")
        name, rest, _ = await keyed(store, name, rest)
        target, path = await route(store, user, name, rest, websocket.scope.get("raw_path"))
    except Refused as error:
        await deny(websocket, error)
        return
    await websocket.app.state.activity.touch(target.target.workload)
    query = websocket.url.query
    url = f"ws://{target.host}:{target.number}{path}"
    if query:
        url += f"?{query}"
    headers = [(k, v) for k, v in websocket.headers.items() if k.lower() not in WS_SKIP]
    cookies = _upstream_cookies(websocket.headers.get("cookie"))
    if cookies:
        headers.append(("cookie", cookies))
    offered = [
        p.strip()
        for p in websocket.headers.get("sec-websocket-protocol", "").split(",")
        if p.strip()
    ]
    try:
        upstream = await connect(
            url,
            additional_headers=headers,
            subprotocols=offered or None,  # type: ignore[arg-type]
            max_size=WS_MAX_MESSAGE,
            max_queue=WS_QUEUE,
            open_timeout=10,
            compression=None,
            proxy=None,
        )
    except (OSError, websockets.exceptions.WebSocketException, TimeoutError) as error:
        await deny(websocket, Refused(502, f"workload {name} refused the WebSocket: {error}"))
        return
    watch = partial(while_allowed, websocket, store, token, target.target)
    async with upstream:
        await websocket.accept(subprotocol=upstream.subprotocol)
        await relay(
            websocket, upstream, target.target.workload, websocket.app.state.activity, watch
        )


async def until_one_ends(*directions: Coroutine[Any, Any, None]) -> None:
    """Run the directions of a relay until one of them ends (its side closed), then stop
    the others and wait for them."""
    tasks = [asyncio.ensure_future(direction) for direction in directions]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


async def relay(
    websocket: WebSocket,
    upstream: ClientConnection,
    workload: str,
    activity: Activity,
    watch: Watch,
) -> None:
    """Relay messages both ways until either side closes, or `watch` ends (the user lost
    access: it closed the client's side); then close the other."""

    async def inbound() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            await activity.touch(workload)
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def outbound() -> None:
        async for data in upstream:
            await activity.touch(workload)
            if isinstance(data, bytes):
                await websocket.send_bytes(data)
            else:
                await websocket.send_text(data)

    try:
        await until_one_ends(inbound(), outbound(), watch())
    finally:
        with contextlib.suppress(Exception):
            await upstream.close()
        with contextlib.suppress(Exception, WebSocketDisconnect):
            await websocket.close()


async def deny(websocket: WebSocket, error: Refused) -> None:
    """Refuse a WebSocket before accepting it, with an HTTP answer where the server can
    send one (a 4xx the client sees), else a close code 4000 + status."""
    response = JSONResponse({"detail": error.detail}, status_code=error.status)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
        return
    await websocket.close(code=4000 + error.status, reason=error.detail[:120])


@router.api_route(
    "/w/{name}/{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
)
async def http_entry(request: Request, name: str, rest: str) -> Response:
    return await proxy_http(request, name, rest)


@router.get("/w/{name}")
async def bare(name: str) -> Response:
    """/w/NAME is /w/NAME/."""
    return RedirectResponse(f"/w/{quote(name, safe='')}/", status_code=307)


@router.websocket("/w/{name}/{rest:path}")
async def websocket_entry(websocket: WebSocket, name: str, rest: str) -> None:
    await proxy_websocket(websocket, name, rest)


def install(app: FastAPI) -> None:
    """Serve the proxy from `app`, with one pooled HTTP client for every request."""
    app.state.activity = Activity(app.state.store)
    app.state.proxy_client = httpx.AsyncClient(
        timeout=httpx.Timeout(30.0, read=None),
        limits=httpx.Limits(max_connections=256, max_keepalive_connections=32),
        follow_redirects=False,
        trust_env=False,
    )
    serve(app, router)
    origins = WorkspaceOrigins.from_environment()
    app.state.workspace_origins = origins
    if origins is not None:
        app.add_middleware(WorkspaceHosts, origins=origins, store=app.state.store)
