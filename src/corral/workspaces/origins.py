"""One origin per workspace (`--workspace-domain ws.example.org`, or the environment's
CORRAL_WORKSPACE_DOMAIN): workspace PROJECT/NAME, of id ID, is served at
NAME-ID.ws.example.org (one DNS label, which a wildcard certificate covers; the id tells
which workload, as names are unique only within a project), so that the scripts of one
workspace's pages cannot read or drive another's, nor the dashboard.

The wildcard name must lead to this server (DNS `*.ws.example.org`, and a certificate
for it behind TLS). On a workspace's host only its own paths are served,
`/w/PROJECT/NAME/...` as on the server's host (so base URLs and Jupyter are unchanged),
and the entry below; everything else there is a 404.

A browser logs in on the server's host (its `corral_token` cookie belongs to that host
only). Opening /w/NAME/... there, with that cookie, answers a page that sends it on to
the workspace's host with a one-time ticket (60 s), which the host trades for its own
cookie `corral_ws` (HttpOnly, SameSite=Lax, that host only): an opaque session id the
server maps to the user (12 h). Every request is still checked against the user's token
and the workload's project. Scripts may send `Authorization: Bearer` to either host.
Without the option the workspaces share the server's origin (docs/workspaces.md says
what that allows).
"""

from __future__ import annotations

import html
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import quote

from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.model.spec import short_name
from corral.store import NotFound, Store

ENVIRONMENT = "CORRAL_WORKSPACE_DOMAIN"
ENTER_PATH = "/_corral/enter"
SESSION_COOKIE = "corral_ws"
TICKET_SECONDS = 60.0
SESSION_SECONDS = 12 * 3600.0
# Tickets and sessions kept at most; beyond, the oldest are forgotten (their users
# enter again through the server's host).
MAX_KEPT = 10_000
# The scope key under which a request on a workspace's host carries the workspace.
SCOPE_KEY = "corral.workspace_host"
PRIVATE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DOMAIN = re.compile(rf"^({LABEL}\.)*{LABEL}$")
# A workspace's label: its name (cut short to fit), "-", its id.
WORKSPACE_LABEL = re.compile(r"^(?:[a-z0-9][-a-z0-9]*-)?([0-9]{1,18})$")
MAX_LABEL = 63


def label_of(workload: str, workload_id: int) -> str:
    """The DNS label of the workspace whose key is `workload`: NAME-ID."""
    suffix = f"-{workload_id}"
    name = short_name(workload)[: MAX_LABEL - len(suffix)].rstrip("-")
    return f"{name}{suffix}"


def check_domain(value: str) -> str:
    """The domain, lowercase; ValueError naming what is wrong."""
    domain = value.strip().lower().strip(".")
    if len(domain) > 190 or not DOMAIN.match(domain):
        raise ValueError(f"{value!r} is not a domain name (like ws.example.org)")
    return domain


@dataclass(frozen=True, slots=True)
class _Grant:
    token: str
    workload: str
    expires: float


class _Grants:
    """Grants by random key, expiring, at most MAX_KEPT (the oldest go first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grants: OrderedDict[str, _Grant] = OrderedDict()

    def add(self, grant: _Grant) -> str:
        key = secrets.token_urlsafe(32)
        with self._lock:
            self._grants[key] = grant
            while len(self._grants) > MAX_KEPT:
                self._grants.popitem(last=False)
        return key

    def get(self, key: str, workload: str, *, once: bool) -> _Grant | None:
        with self._lock:
            grant = self._grants.pop(key, None) if once else self._grants.get(key)
            if grant is not None and grant.expires < time.time():
                self._grants.pop(key, None)
                return None
        return grant if grant is not None and grant.workload == workload else None


class WorkspaceOrigins:
    """The workspace domain, and the tickets and sessions of its hosts."""

    def __init__(self, domain: str) -> None:
        self.domain = check_domain(domain)
        self._tickets = _Grants()
        self._sessions = _Grants()

    @classmethod
    def from_environment(cls) -> WorkspaceOrigins | None:
        """From CORRAL_WORKSPACE_DOMAIN; None when it is not set (one shared origin)."""
        value = os.environ.get(ENVIRONMENT, "").strip()
        return cls(value) if value else None

    def workspace_of(self, host: str) -> tuple[str, int] | None:
        """The label and the workload id of the workspace whose host `host` (a Host
        header) is, or None."""
        name = host.rpartition(":")[0] if not host.endswith("]") and ":" in host else host
        name = name.lower().rstrip(".")
        label, _, rest = name.partition(".")
        found = WORKSPACE_LABEL.match(label) if rest == self.domain else None
        return (label, int(found[1])) if found else None

    def entry_url(
        self,
        request_host: str,
        scheme: str,
        token: str,
        workload: str,
        workload_id: int,
        path: str,
    ) -> str:
        """Where a browser logged in on the server's host goes to open `path` of the
        workload (its key, and its id): its host's entry, with a fresh one-time ticket."""
        _, colon, port = request_host.rpartition(":")
        suffix = f":{port}" if colon and port.isdigit() else ""
        ticket = self._tickets.add(_Grant(token, workload, time.time() + TICKET_SECONDS))
        return (
            f"{scheme}://{label_of(workload, workload_id)}.{self.domain}{suffix}{ENTER_PATH}"
            f"?ticket={ticket}&next={quote(path, safe='/')}"
        )

    def handoff(self, url: str) -> Response:
        """The page that takes a browser to a workspace's entry: a refresh rather than a
        redirect, which the dashboard's `form-action 'self'` would block right after the
        login form. The ticket must not leak in a Referer, nor stay in a cache."""
        link = html.escape(url, quote=True)
        body = (
            f'<!DOCTYPE html><html><head><meta http-equiv="refresh" content="0;url={link}">'
            f'<title>corral</title></head><body><a href="{link}">Open the workspace</a>'
            "</body></html>"
        )
        return HTMLResponse(body, headers=PRIVATE)

    def session_token(self, cookie: str | None, workload: str) -> str | None:
        """The token behind a workspace host's session cookie, for that workspace only."""
        if not cookie:
            return None
        grant = self._sessions.get(cookie, workload, once=False)
        return grant.token if grant is not None else None

    def enter(self, workload: str, query: QueryParams, secure: bool) -> Response:
        """The entry of a workspace's host: trade a ticket for the host's own cookie."""
        grant = self._tickets.get(query.get("ticket", ""), workload, once=True)
        if grant is None:
            return JSONResponse(
                {"detail": "this link was used or has expired: open the workspace again"},
                status_code=403,
            )
        session = self._sessions.add(_Grant(grant.token, workload, time.time() + SESSION_SECONDS))
        wanted = query.get("next", "")
        home = f"/w/{workload}/"
        # Only a path of this workspace: never elsewhere (an open redirect).
        target = wanted if wanted.startswith(home) and "\\" not in wanted else home
        response = RedirectResponse(target, status_code=303, headers=PRIVATE)
        response.set_cookie(
            SESSION_COOKIE,
            session,
            max_age=int(SESSION_SECONDS),
            path="/",
            httponly=True,
            samesite="lax",
            secure=secure,
        )
        return response


class WorkspaceHosts:
    """ASGI middleware: on a workspace's host, serve its entry and its own
    /w/PROJECT/NAME/ paths (marked in the scope for the proxy), and nothing else."""

    def __init__(self, app: ASGIApp, origins: WorkspaceOrigins, store: Store) -> None:
        self.app = app
        self.origins = origins
        self.store = store
        # Workload id -> key: an id is never given twice, so what was found stays true.
        self._keys: dict[int, str] = {}

    async def _key(self, label: str, workload_id: int) -> str | None:
        """The key of the workload of that id, when the label is the one it gives."""
        key = self._keys.get(workload_id)
        if key is None:
            try:
                key = await run_in_threadpool(self.store.workload_key_of, workload_id)
            except NotFound:
                return None
            if len(self._keys) >= MAX_KEPT:
                self._keys.clear()
            self._keys[workload_id] = key
        return key if label_of(key, workload_id) == label else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        found = self.origins.workspace_of(Headers(scope=scope).get("host", ""))
        if found is None:
            await self.app(scope, receive, send)
            return
        workload = await self._key(*found)
        if workload is None:
            detail = "no such workspace: open it from the server again"
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 4404})
                return
            await JSONResponse({"detail": detail}, status_code=404)(scope, receive, send)
            return
        path: str = scope["path"]
        if scope["type"] == "http" and path == ENTER_PATH and scope["method"] == "GET":
            query = QueryParams(scope.get("query_string", b"").decode("latin-1"))
            secure = scope.get("scheme") == "https"
            await self.origins.enter(workload, query, secure)(scope, receive, send)
            return
        if path == f"/w/{workload}" or path.startswith(f"/w/{workload}/"):
            await self.app({**scope, SCOPE_KEY: workload}, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4404})
            return
        detail = f"this host serves the workspace {workload} only, under /w/{workload}/"
        await JSONResponse({"detail": detail}, status_code=404)(scope, receive, send)
