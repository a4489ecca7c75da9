"""Who may reach a workload's ports, exec and shell, and where its task listens.

Only the workload's owner, its project's project-admins and admins get through: the task
runs as its owner's account, so whoever enters it acts as the owner, and the rule is the
one of who may manage the workload (corral.api.deps.may_act_on). Viewers read, but do
not enter a project's processes. A request proves who it is with `Authorization: Bearer`
or with the dashboard's login cookie (HttpOnly, SameSite=Strict). The target is found in
the store: the node's address and the number its agent gave the port, never localhost by
assumption.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.websockets import WebSocket

from corral.api import tokens_cache
from corral.api.deps import ENTER, may_act_on, may_read
from corral.api.errors import Forbidden
from corral.model.spec import MAIN_PORT, PortSpec, workload_key
from corral.store import NotFound, Store, UserRecord
from corral.store.workspaces import Target

log = logging.getLogger("corral.workspaces")

# The dashboard's login cookie (corral.dashboard.routes sets it).
COOKIE = "corral_token"


class Refused(Exception):
    """The request may not reach the workload: answered with `status` and `detail`."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Route:
    """Where a proxied request goes: the task's host and port, and the path prefix the
    program does not know about (stripped), or "" when it serves under it itself."""

    target: Target
    port: PortSpec
    host: str
    number: int
    strip: str


def credentials(headers: Headers, cookies: dict[str, str]) -> tuple[str | None, bool]:
    """The token a request carries, and whether it came from the cookie."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), False
    cookie = cookies.get(COOKIE)
    return (cookie, True) if cookie else (None, False)


async def authenticate(store: Store, token: str | None) -> UserRecord:
    """The token's user; Refused(401) without a valid token."""
    if not token:
        raise Refused(401, "log in first: a bearer token or the dashboard's login is required")
    found = await tokens_cache.of(store).user(token)
    if found is None:
        raise Refused(401, "the token is not valid")
    return found


def same_origin(headers: Headers) -> bool:
    """False for a browser request sent from another site (its Origin is not this host):
    such a request must not ride on the login cookie."""
    origin = headers.get("origin")
    return origin is None or urlsplit(origin).netloc == headers.get("host")


# How often an open session (exec, shell, port-forward, a WebSocket through the proxy)
# checks that its user may still enter the workload. The check reads the token cache,
# which a revocation or a change of users or memberships clears on this server.
RECHECK_SECONDS = 1.0
# The close code of a session whose user lost access (RFC 6455: policy violation), and
# the longest reason a close frame carries.
ACCESS_ENDED = 1008
MAX_REASON = 123
# What a session's bridge runs beside its streams: `while_allowed`, its arguments given.
Watch = Callable[[], Coroutine[Any, Any, None]]


async def while_allowed(
    websocket: WebSocket, store: Store, token: str | None, target: Target
) -> None:
    """Return once the user of `token` may no longer enter `target`, having closed the
    client's WebSocket with ACCESS_ENDED and why: the token was revoked or expired, the
    user deleted, taken out of the project or no longer its project-admin. A session was
    let in once; this keeps it from outliving the right to it (by RECHECK_SECONDS at most,
    on this server)."""
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        why = await _why_not(store, token, target)
        if why is not None:
            break
    log.info("a session of %s ended: %s", target.workload, why)
    reason = f"session ended: {why}".encode()[:MAX_REASON].decode("utf-8", "ignore")
    with contextlib.suppress(Exception):
        await websocket.close(ACCESS_ENDED, reason)


async def _why_not(store: Store, token: str | None, target: Target) -> str | None:
    """Why the user of `token` may not enter `target` now, or None. The user entered
    already, so the workload's name is theirs to know: no 404 hides it here. An error of
    the store is logged and decides nothing (the next check decides)."""
    try:
        user = await authenticate(store, token)
        may_act_on(user, target.workload, target.project, target.user, ENTER)
    except (Refused, Forbidden) as refused:
        return str(refused)
    except Exception:
        log.exception("checking a session's access to %s failed", target.workload)
    return None


def check_access(user: UserRecord, target: Target) -> None:
    """Refused unless `user` may enter the workload's task (its URLs, exec, shell,
    port-forward): its owner, the project's project-admins and admins, by the rule of who
    may manage it (403 for a teammate, with why). Another project's workload is 404 with
    the answer of one that does not exist, so that names do not leak."""
    if not may_read(user, target.project):
        raise Refused(404, f"workload {target.workload!r} not found")
    try:
        may_act_on(user, target.workload, target.project, target.user, ENTER)
    except Forbidden as refused:
        raise Refused(403, str(refused)) from None


# Where workloads' tasks run, read from the store at most every TARGET_TTL seconds per
# task: a page load is dozens of proxied requests. Access is checked on every request
# (the project of a workload never changes); a task that stopped within the TTL answers
# 502 instead of 409, for that long.
TARGET_TTL = 2.0
TARGETS_KEPT = 1024
_targets: dict[tuple[int, str, int], tuple[float, Target]] = {}


async def read_target(store: Store, name: str, task: int) -> Target:
    """The store's Target of the task, remembered for TARGET_TTL seconds; NotFound."""
    key = (id(store), name, task)
    now = time.monotonic()
    kept = _targets.get(key)
    if kept is not None and now - kept[0] < TARGET_TTL:
        return kept[1]
    target = await run_in_threadpool(store.workspace_target, name, task)
    if len(_targets) >= TARGETS_KEPT:
        _targets.clear()
    # Only a running, started task is remembered: the others are waited on.
    if target.state == "running" and target.numbers:
        _targets[key] = (now, target)
    return target


def forget_target(store: Store, name: str) -> None:
    """Read the workload's tasks from the store again next time (it was stopped)."""
    for key in [k for k in _targets if k[0] == id(store) and k[1] == name]:
        _targets.pop(key, None)


async def find_target(store: Store, user: UserRecord, name: str, task: int = 0) -> Target:
    """The running task `task` of workload `name`, which `user` may enter."""
    try:
        target = await read_target(store, name, task)
    except NotFound:
        raise Refused(404, f"workload {name!r} not found") from None
    check_access(user, target)
    if target.status != "running":
        raise Refused(409, f"workload {name} is {target.status}, not running")
    if target.node is None or target.address is None:
        raise Refused(404, f"workload {name} has no task {task}")
    if target.state != "running":
        raise Refused(503, f"task {task} of {name} is starting; try again in a moment")
    return target


def choose_port(target: Target, first: str) -> tuple[PortSpec, bool]:
    """The port a path under /w/NAME/ goes to: a declared port named by its first
    segment (which is then consumed), else `main`. Refused when neither is declared."""
    by_name = {port.name: port for port in target.ports}
    if first and first != MAIN_PORT and first in by_name:
        return by_name[first], True
    if MAIN_PORT in by_name:
        return by_name[MAIN_PORT], False
    declared = ", ".join(sorted(by_name)) or "none"
    raise Refused(
        404,
        f"workload {target.workload} declares no port {first or MAIN_PORT!r} "
        f"(its ports: {declared})",
    )


def named_port(target: Target, name: str) -> PortSpec:
    """The declared port `name` (a port-forward's), or the declared port whose number on
    the node is `name` when it is a number (names start with a letter); Refused(404)
    otherwise: nothing but declared ports can be reached."""
    for port in target.ports:
        if port.name == name or (name.isdigit() and target.numbers.get(port.name) == int(name)):
            return port
    declared = ", ".join(
        f"{p.name} on {target.numbers[p.name]}" if p.name in target.numbers else p.name
        for p in sorted(target.ports, key=lambda p: p.name)
    )
    what = "on number" if name.isdigit() else "named"
    raise Refused(
        404,
        f"workload {target.workload} declares no port {what} {name!r} "
        f"(its ports: {declared or 'none'})",
    )


def number_of(target: Target, port: PortSpec) -> int:
    """The number the agent gave `port`; Refused(503) until it has reported it."""
    number = target.numbers.get(port.name)
    if number is None:
        raise Refused(503, f"the port {port.name} of {target.workload} is not ready yet")
    return int(number)


# Characters left as they are when a decoded path is encoded again.
PATH_SAFE = "/:@!$&'()*+,;=~-._"


async def keyed(store: Store, first: str, rest: str) -> tuple[str, str, bool]:
    """The workload a path /w/FIRST/REST names, and the rest of the path: PROJECT/NAME
    (FIRST the project, REST's first segment the name), else a workload of before names
    were per project, named FIRST alone. True when /w/PROJECT/NAME came without its
    trailing "/"."""
    name, slash, remainder = rest.partition("/")
    if name:
        key = workload_key(first, name)
        try:
            await read_target(store, key, 0)
        except NotFound:
            pass
        else:
            return key, remainder, not slash
    return first, rest, False


async def route(
    store: Store, user: UserRecord, name: str, rest: str, raw: bytes | None = None
) -> tuple[Route, str]:
    """Where /w/NAME/REST goes (NAME a workload's key, PROJECT/NAME: see `keyed`), and the
    path to send there, percent-encoded: taken from the request's `raw` path when given,
    so that an encoded "/" (%2F) stays encoded."""
    target = await find_target(store, user, name)
    first, _, remainder = rest.partition("/")
    port, consumed = choose_port(target, first)
    number = number_of(target, port)
    prefix = f"/w/{name}/{port.name}/" if consumed else f"/w/{name}/"
    tail = remainder if consumed else rest
    path = quote(prefix + tail if port.base_url else "/" + tail, safe=PATH_SAFE)
    sent = raw.decode("latin-1") if raw else ""
    if sent.startswith(prefix):
        path = sent if port.base_url else "/" + sent[len(prefix) :]
    assert target.address is not None
    strip = "" if port.base_url else prefix
    return Route(target, port, host_of(target.address), number, strip), path


def host_of(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
