"""`corral exec`, `corral shell` and `corral port-forward` over WebSockets.

    /api/v1/workloads/NAME/exec?command=ARG&command=ARG&tty=true&task=0
    /api/v1/workloads/NAME/ports/PORT/forward

Exec: the server asks the task's agent to run the command beside the task (see
corral.agent.exec): an agent in this process hands over the session's fds; a Ray node's
agent serves them on its node's relay (corral.workspaces.exec_remote). Frames to the client
are binary, the first byte saying which stream (1 stdout or the terminal, 2 stderr), and
a last text frame `{"exit": CODE}`. Frames from the client are binary (its input) or
text: `{"resize": [ROWS, COLS]}`, `{"eof": true}`.
Port-forward: binary frames carry the bytes of one TCP connection to the declared port.

Everything is refused before the WebSocket is accepted and before anything starts: an
unknown workload, one not running, an undeclared port, a user who may not enter it (only
its owner, its project's project-admins and admins may: its commands run as its owner).
Reads and writes wait on the event loop (no thread per stream), one chunk at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from fastapi import APIRouter, WebSocket
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from corral.agent.exec import ExecSession
from corral.agent.fdio import read_fd, write_fd
from corral.api.deps import API, visible_workload
from corral.api.routes import PrefixedRoute
from corral.api.threads import run_waiting
from corral.store import Conflict, Invalid, NotFound
from corral.store.workspaces import Target
from corral.workspaces.access import (
    Refused,
    Watch,
    authenticate,
    credentials,
    find_target,
    host_of,
    named_port,
    number_of,
    same_origin,
    while_allowed,
)
from corral.workspaces.exec_remote import open_relayed
from corral.workspaces.proxy import deny, until_one_ends
from corral.workspaces.session_audit import EXEC, FORWARD, SessionAudit, recorded

log = logging.getLogger("corral.exec")

CHUNK = 64 * 1024
STDOUT, STDERR = b"\x01", b"\x02"
MAX_ARGS = 4096
MAX_ARG = 64 * 1024

router = APIRouter(prefix=API, include_in_schema=False, route_class=PrefixedRoute)


class Opened(Protocol):
    """A session that opened: its streams bridged to the client's WebSocket until it ends
    (its exit code, if it has one) or `watch` ends it, and what closes it after."""

    async def bridge(self, websocket: WebSocket, watch: Watch) -> int | None: ...

    async def close(self) -> None: ...


async def _enter(
    websocket: WebSocket, audit: SessionAudit, name: str, task: int
) -> tuple[str | None, Target]:
    """The caller's token, and the running task they may enter; Refused otherwise. `name`
    is the workload's name, of the project in the `project` query parameter when given
    (as the API's paths take it)."""
    store = websocket.app.state.store
    token, _ = credentials(websocket.headers, websocket.cookies)
    user = await authenticate(store, token)
    audit.about(user=user.name)
    if not same_origin(websocket.headers):
        raise Refused(403, "cross-site WebSocket refused")
    project = websocket.query_params.get("project")
    try:
        found = await run_in_threadpool(visible_workload, store, user, name, project)
    except NotFound:
        raise Refused(404, f"workload {name!r} not found") from None
    except (Conflict, Invalid) as error:
        raise Refused(409 if isinstance(error, Conflict) else 422, str(error)) from None
    audit.about(workload=found.name)
    return token, await find_target(store, user, found.name, task)


async def _run(websocket: WebSocket, audit: SessionAudit, opened: Opened, watch: Watch) -> None:
    """The session, from its audit record to its end: accepted, bridged until it ends, its
    user loses access or its client goes away, then closed and its record completed."""
    code = None
    try:
        await audit.opened()
        await websocket.accept()
        code = await opened.bridge(websocket, watch)
    finally:
        await opened.close()
        await audit.ended(code)


def _command(websocket: WebSocket) -> tuple[list[str], bool, int]:
    """The command, whether it wants a terminal, and the task, from the query."""
    params = websocket.query_params
    command = params.getlist("command")
    if not command or not command[0]:
        raise Refused(422, "command: give the program to run (command=PROGRAM&command=ARG...)")
    if len(command) > MAX_ARGS or any(len(arg) > MAX_ARG or "\x00" in arg for arg in command):
        raise Refused(422, f"command: at most {MAX_ARGS} arguments of {MAX_ARG} bytes, no NUL")
    tty = params.get("tty", "false").lower()
    if tty not in ("true", "false", "1", "0"):
        raise Refused(422, "tty: must be true or false")
    raw = params.get("task", "0")
    if not raw.isdigit() or int(raw) > 4096:
        raise Refused(422, "task: must be a task index (0 to 4096)")
    return command, tty in ("true", "1"), int(raw)


@router.websocket("/workloads/{name}/exec")
async def exec_entry(websocket: WebSocket, name: str) -> None:
    """Run a command beside a running task, its streams over this WebSocket."""
    audit = SessionAudit.of(websocket, EXEC, name)
    try:
        command, tty, task = _command(websocket)
        audit.about(task=task, command=recorded(command))
        token, target = await _enter(websocket, audit, name, task)
        cluster = websocket.app.state.control.cluster
        opened = await _open(cluster, target, target.workload, task, command, tty)
    except Refused as error:
        await audit.refused(error.status)
        await deny(websocket, error)
        return
    watch = partial(while_allowed, websocket, websocket.app.state.store, token, target)
    await _run(websocket, audit, opened, watch)


async def _open(
    cluster: Any, target: Target, name: str, task: int, command: list[str], tty: bool
) -> Opened:
    """The command started beside the task: by an agent in this process, which hands over
    its fds, or by a Ray node's, which offers them on its node's relay."""
    assert target.node is not None
    if getattr(cluster, "open_session", None) is not None:
        return _Local(
            cluster, target.node, await _open_local(cluster, target, name, task, command, tty)
        )
    remote = getattr(cluster, "open_remote_session", None)
    if remote is not None:
        return await open_relayed(remote, target.node, name, task, command, tty)
    raise Refused(501, "this server has no agents to run commands on")


@dataclass
class _Local:
    """A session of an agent in the server's process: its fds."""

    cluster: Any
    node: str
    session: ExecSession

    async def bridge(self, websocket: WebSocket, watch: Watch) -> int | None:
        return await _bridge(websocket, self.session, watch)

    async def close(self) -> None:
        await run_waiting(self.session.release)
        self.cluster.forget_session(self.node, self.session)


async def _open_local(
    cluster: Any, target: Target, name: str, task: int, command: list[str], tty: bool
) -> ExecSession:
    """A session of an agent in the server's process; Refused when it cannot start."""
    try:
        session: ExecSession = await run_waiting(
            cluster.open_session, target.node, name, task, command, tty
        )
    except LookupError as error:
        raise Refused(409, str(error)) from None
    except (OSError, ValueError) as error:
        detail = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise Refused(400, f"cannot start {command[0]!r}: {detail}") from None
    return session


async def _bridge(websocket: WebSocket, session: ExecSession, watch: Watch) -> int | None:
    """Relay the session's streams until it ends (then send its exit code, and return it),
    the client goes away or `watch` ends (its user lost access); then None, and the caller
    kills the session."""

    async def pump(fd: int, tag: bytes) -> None:
        while data := await read_fd(fd):
            await websocket.send_bytes(tag + data)

    async def inbound() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                with contextlib.suppress(OSError):
                    await write_fd(session.input, message["bytes"])
            elif message.get("text") is not None:
                session.control(message["text"])

    pumps = [asyncio.ensure_future(pump(session.output, STDOUT))]
    if session.errors is not None:
        pumps.append(asyncio.ensure_future(pump(session.errors, STDERR)))
    # The client's side of the session: it ends when the client goes, or may no longer be.
    listener = asyncio.ensure_future(until_one_ends(inbound(), watch()))
    try:
        outputs: asyncio.Future[Any] = asyncio.gather(*pumps)
        done, _ = await asyncio.wait({outputs, listener}, return_when=asyncio.FIRST_COMPLETED)
        if listener in done:
            return None
        code = await session.exited(listener)
        if code is None:
            return None
        await websocket.send_text(json.dumps({"exit": code}))
        await websocket.close(1000)
        return code
    except WebSocketDisconnect:
        return None
    finally:
        for future in (*pumps, listener):
            future.cancel()
        for future in (*pumps, listener):
            with contextlib.suppress(BaseException):
                await future


@router.websocket("/workloads/{name}/ports/{port}/forward")
async def forward_entry(websocket: WebSocket, name: str, port: str) -> None:
    """One TCP connection to a declared port of a running task, over this WebSocket."""
    audit = SessionAudit.of(websocket, FORWARD, name)
    audit.about(task=0)
    try:
        token, target = await _enter(websocket, audit, name, 0)
        opened = await _connect(target, target.workload, port)
    except Refused as error:
        await audit.refused(error.status)
        await deny(websocket, error)
        return
    await websocket.app.state.activity.touch(target.workload)
    watch = partial(while_allowed, websocket, websocket.app.state.store, token, target)
    await _run(websocket, audit, opened, watch)


async def _connect(target: Target, name: str, port: str) -> _Forwarded:
    """A connection to the declared port `port` of the task; Refused when it has no such
    port or nothing answers there."""
    number = number_of(target, named_port(target, port))
    assert target.address is not None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(target.address, number), 10)
    except (OSError, TimeoutError) as error:
        raise Refused(502, f"nothing answers on port {port} of {name}: {error}") from None
    log.debug("forwarding to %s:%s", host_of(target.address), number)
    return _Forwarded(reader, writer)


@dataclass
class _Forwarded:
    """A port-forward's connection to the task's port."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def bridge(self, websocket: WebSocket, watch: Watch) -> int | None:
        await _relay_tcp(websocket, self.reader, self.writer, watch)
        return None

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


async def _relay_tcp(
    websocket: WebSocket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, watch: Watch
) -> None:
    async def outbound() -> None:
        while data := await reader.read(CHUNK):
            await websocket.send_bytes(data)

    async def inbound() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if data:
                writer.write(data)
                await writer.drain()

    try:
        await until_one_ends(outbound(), inbound(), watch())
    finally:
        with contextlib.suppress(Exception):
            await websocket.close(1000)
