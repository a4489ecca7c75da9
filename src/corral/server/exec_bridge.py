"""`corral exec`, `corral shell` and `corral port-forward` over WebSockets.

    /api/v1/workloads/NAME/exec?command=ARG&command=ARG&tty=true&task=0
    /api/v1/workloads/NAME/ports/PORT/forward

Exec: the server asks the task's agent to run the command beside the task (see
corral.agent.exec): an agent in this process hands over the session's fds; a Ray node's
agent serves them on its node's relay (corral.server.exec_remote). Frames to the client
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
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from corral.agent.exec import ExecSession
from corral.agent.fdio import read_fd, write_fd
from corral.server.deps import API
from corral.server.exec_remote import bridge_relayed, open_relayed
from corral.server.proxy import deny, until_one_ends
from corral.server.routes import PrefixedRoute
from corral.server.threads import run_waiting
from corral.server.workspace_access import (
    Refused,
    authenticate,
    credentials,
    find_target,
    host_of,
    named_port,
    number_of,
    same_origin,
)
from corral.store import UserRecord
from corral.store.workspaces import Target

log = logging.getLogger("corral.exec")

CHUNK = 64 * 1024
STDOUT, STDERR = b"\x01", b"\x02"
MAX_ARGS = 4096
MAX_ARG = 64 * 1024

router = APIRouter(prefix=API, include_in_schema=False, route_class=PrefixedRoute)


async def _enter(websocket: WebSocket, name: str, task: int) -> tuple[UserRecord, Target]:
    """Who asks, and the running task they may enter; Refused otherwise."""
    token, _ = credentials(websocket.headers, websocket.cookies)
    user = await authenticate(websocket.app.state.store, token)
    if not same_origin(websocket.headers):
        raise Refused(403, "cross-site WebSocket refused")
    return user, await find_target(websocket.app.state.store, user, name, task)


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
    cluster = websocket.app.state.background.cluster
    # Agents in this process hand over their session's fds; others (Ray nodes') offer
    # it on their node's relay.
    local = getattr(cluster, "open_session", None) is not None
    remote = getattr(cluster, "open_remote_session", None)
    try:
        command, tty, task = _command(websocket)
        _, target = await _enter(websocket, name, task)
        assert target.node is not None
        if local:
            session = await _open_local(cluster, target, name, task, command, tty)
        elif remote is not None:
            relayed = await open_relayed(remote, target.node, name, task, command, tty)
        else:
            raise Refused(501, "this server has no agents to run commands on")
    except Refused as error:
        await deny(websocket, error)
        return
    if not local:
        try:
            await websocket.accept()
        except BaseException:
            await relayed.close()
            raise
        await bridge_relayed(websocket, relayed)
        return
    try:
        await websocket.accept()
        await _bridge(websocket, session)
    finally:
        await run_waiting(session.release)
        cluster.forget_session(target.node, session)


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


async def _bridge(websocket: WebSocket, session: ExecSession) -> None:
    """Relay the session's streams until it ends (then send its exit code) or the client
    goes away (then the session is killed by the caller)."""

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
    listener = asyncio.ensure_future(inbound())
    try:
        outputs: asyncio.Future[Any] = asyncio.gather(*pumps)
        done, _ = await asyncio.wait({outputs, listener}, return_when=asyncio.FIRST_COMPLETED)
        if listener in done:
            return
        code = await session.exited(listener)
        if code is None:
            return
        await websocket.send_text(json.dumps({"exit": code}))
        await websocket.close(1000)
    except WebSocketDisconnect:
        return
    finally:
        for future in (*pumps, listener):
            future.cancel()
        for future in (*pumps, listener):
            with contextlib.suppress(BaseException):
                await future


@router.websocket("/workloads/{name}/ports/{port}/forward")
async def forward_entry(websocket: WebSocket, name: str, port: str) -> None:
    """One TCP connection to a declared port of a running task, over this WebSocket."""
    try:
        _, target = await _enter(websocket, name, 0)
        number = number_of(target, named_port(target, port))
        assert target.address is not None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(target.address, number), 10
            )
        except (OSError, TimeoutError) as error:
            raise Refused(502, f"nothing answers on port {port} of {name}: {error}") from None
    except Refused as error:
        await deny(websocket, error)
        return
    log.debug("forwarding to %s:%s", host_of(target.address), number)
    await websocket.app.state.activity.touch(name)
    try:
        await websocket.accept()
        await _relay_tcp(websocket, reader, writer)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _relay_tcp(
    websocket: WebSocket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
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
        await until_one_ends(outbound(), inbound())
    finally:
        with contextlib.suppress(Exception):
            await websocket.close(1000)
