"""`corral exec` and `corral shell` on a Ray node: the node's agent starts the command
beside the task and serves its streams on a TCP listener bound to the node's address; the
server connects there with the one-time secret it got back from the actor call.

    server ── actor call open_session(...) ──▶ agent: spawn, keep it pending
           ◀── {host, port, secret} ─────────
           ── TCP connect, send the 32-byte secret ─▶ the pending session is claimed
           ◀── OK, then frames both ways ───────────▶

A frame is a type byte, a 4-byte big-endian length and the payload. To the server: OUT
and ERR (the command's stdout or terminal, its stderr), EXIT (4 bytes, the exit code, last).
From the server: IN (the client's input) and CONTROL (a client's JSON control message,
see ExecSession.control).

Guarantees: a secret is 32 random bytes, good for one connection only; a connection that
does not send a known secret within HANDSHAKE_SECONDS is closed without a byte; a session
not claimed within CLAIM_SECONDS is killed. A session ends when its task stops (the agent
kills it), or when the connection closes (the relay kills it). Everything runs on one
event loop in a thread of the agent's process, with backpressure both ways (a slow reader
makes the command wait on its pipe, never the loop).

This module does not import Ray; the server side is corral.workspaces.exec_remote.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.agent.exec import ExecSession
from corral.agent.fdio import read_fd, write_fd

if TYPE_CHECKING:
    # The server imports this module for the protocol; it needs no agent.
    from corral.agent import Agent

log = logging.getLogger("corral.exec_relay")

OUT, ERR, EXIT, IN, CONTROL, OK = 1, 2, 3, 4, 5, 6
HEADER = struct.Struct(">BI")
# The largest frame either side accepts: input arrives in 64 KiB chunks, control
# messages are small.
MAX_FRAME = 1 << 20
MAX_CONTROL = 4096
SECRET_BYTES = 32
HANDSHAKE_SECONDS = 5.0
CLAIM_SECONDS = 15.0
# How long a relayed connection waits for the other side to close after the last frame.
LINGER_SECONDS = 5.0
# At most this many sessions waiting for their connection, and connections that have
# not yet sent their secret, per node: beyond, new ones are refused.
MAX_PENDING = 64
MAX_HANDSHAKES = 64


def frame(kind: int, payload: bytes = b"") -> bytes:
    """One frame of the relay's protocol."""
    return HEADER.pack(kind, len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next frame; asyncio.IncompleteReadError at the end of the stream, ValueError
    for a frame too large."""
    kind, size = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return kind, await reader.readexactly(size) if size else b""


@dataclass(frozen=True, slots=True)
class Ticket:
    """Where the server claims a session: host, port and the one-time secret."""

    host: str
    port: int
    secret: bytes


@dataclass
class _Pending:
    session: ExecSession
    expiry: asyncio.TimerHandle | None = None


class SessionRelay:
    """The listener of one node's agent. `offer(session)` hands out a Ticket; the server
    connects with it once. `on_end` is called with each session once it is released."""

    def __init__(
        self,
        host: str,
        on_end: Callable[[ExecSession], None],
        claim_seconds: float = CLAIM_SECONDS,
    ) -> None:
        self.host = host
        self.on_end = on_end
        self.claim_seconds = claim_seconds
        self._lock = threading.Lock()
        # By sha256 of the secret: looking one up reveals nothing of the secret.
        self._pending: dict[bytes, _Pending] = {}
        self._handshakes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def _start(self) -> None:
        """The listener and its loop, at the first session (an agent that never runs a
        command opens no port)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="corral-exec-relay", daemon=True)
        thread.start()
        # Started on its own loop's thread: the caller's thread may run a loop of its own.
        starting = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, self.host, 0, limit=2 * MAX_FRAME), loop
        )
        try:
            server = starting.result(timeout=10)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()
            raise
        self._loop, self._server, self._thread = loop, server, thread
        self.port = int(server.sockets[0].getsockname()[1])

    def offer(self, session: ExecSession) -> Ticket:
        """Keep `session` until the server claims it with the returned ticket (killed
        after claim_seconds unclaimed). RuntimeError when too many wait already (the
        session is then released)."""
        try:
            with self._lock:
                if self._loop is None:
                    self._start()
                if len(self._pending) >= MAX_PENDING:
                    raise RuntimeError("too many exec sessions waiting for their connection")
                secret = secrets.token_bytes(SECRET_BYTES)
                key = hashlib.sha256(secret).digest()
                entry = _Pending(session)
                self._pending[key] = entry
                loop = self._loop
        except BaseException:
            self._release(session)
            raise
        assert loop is not None
        loop.call_soon_threadsafe(self._arm, key, entry)
        return Ticket(self.host, self.port, secret)

    def _arm(self, key: bytes, entry: _Pending) -> None:
        assert self._loop is not None
        entry.expiry = self._loop.call_later(self.claim_seconds, self._expire, key)

    def _expire(self, key: bytes) -> None:
        with self._lock:
            entry = self._pending.pop(key, None)
        if entry is not None:
            log.info("an exec session of %s was not claimed: killed", entry.session.workload)
            self._release_later(entry.session)

    def _claim(self, secret: bytes) -> ExecSession | None:
        with self._lock:
            entry = self._pending.pop(hashlib.sha256(secret).digest(), None)
        if entry is None:
            return None
        if entry.expiry is not None:
            entry.expiry.cancel()
        return entry.session

    def _release(self, session: ExecSession) -> None:
        try:
            session.release()
        finally:
            self.on_end(session)

    def _release_later(self, session: ExecSession) -> None:
        # release() reaps the killed group, which may take a moment: not on the loop.
        assert self._loop is not None
        self._loop.run_in_executor(None, self._release, session)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = None
        try:
            session = await self._handshake(reader)
            if session is None:
                return
            writer.write(frame(OK))
            await writer.drain()
            await _relay(session, reader, writer)
            await _linger(reader, writer)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if session is not None:
                await asyncio.get_running_loop().run_in_executor(None, self._release, session)

    async def _handshake(self, reader: asyncio.StreamReader) -> ExecSession | None:
        """The session whose secret the connection sends in time; None otherwise."""
        with self._lock:
            if self._handshakes >= MAX_HANDSHAKES:
                return None
            self._handshakes += 1
        try:
            secret = await asyncio.wait_for(reader.readexactly(SECRET_BYTES), HANDSHAKE_SECONDS)
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            return None
        finally:
            with self._lock:
                self._handshakes -= 1
        return self._claim(secret)

    def close(self) -> None:
        """Stop listening and kill the sessions still waiting for their connection
        (claimed ones end with the agent, which kills all its sessions)."""
        with self._lock:
            doomed = [entry.session for entry in self._pending.values()]
            self._pending.clear()
            loop, server = self._loop, self._server
        for session in doomed:
            self._release(session)
        if loop is None or server is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_shut(server), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not loop.is_running():
            loop.close()


async def _shut(server: asyncio.Server) -> None:
    """Stop listening and end every connection's relay (their sessions are released)."""
    server.close()
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=5)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """End a relayed connection gracefully: send end of stream after the last frame, and
    read and drop what the other side still sends (input typed after the command ended)
    until it closes, for LINGER_SECONDS at most. A socket closed with input unread is
    reset instead, and the other side may then lose the end of the output."""
    if writer.can_write_eof():
        writer.write_eof()

    async def drop() -> None:
        while await reader.read(1 << 16):
            pass

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drop(), LINGER_SECONDS)


async def _relay(
    session: ExecSession, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """The session's streams over the connection until the command ends (then its exit
    code is sent) or the connection closes (the caller then kills it)."""

    async def pump(fd: int, kind: int) -> None:
        while data := await read_fd(fd):
            writer.write(frame(kind, data))
            await writer.drain()

    async def inbound() -> None:
        while True:
            kind, data = await read_frame(reader)
            if kind == IN:
                with contextlib.suppress(OSError):
                    await write_fd(session.input, data)
            elif kind == CONTROL and len(data) <= MAX_CONTROL:
                session.control(data.decode("utf-8", "replace"))

    pumps: list[asyncio.Future[None]] = [asyncio.ensure_future(pump(session.output, OUT))]
    if session.errors is not None:
        pumps.append(asyncio.ensure_future(pump(session.errors, ERR)))
    listener = asyncio.ensure_future(inbound())
    outputs: asyncio.Future[Any] = asyncio.gather(*pumps)
    try:
        done, _ = await asyncio.wait({outputs, listener}, return_when=asyncio.FIRST_COMPLETED)
        if listener in done or outputs.exception() is not None:
            return
        code = await session.exited(listener)
        if code is None:
            return
        writer.write(frame(EXIT, struct.pack(">i", code)))
        await writer.drain()
    finally:
        for future in (*pumps, listener):
            future.cancel()
        for future in (outputs, *pumps, listener):
            with contextlib.suppress(BaseException):
                await future


def open_relayed(
    agent: Agent, relay: SessionRelay, workload: str, task: int, command: list[str], tty: bool
) -> dict[str, Any]:
    """Start `command` beside the task (see Agent.open_session) and offer it on `relay`:
    {"host", "port", "secret"}, or {"refused": WHY, "detail": ...} with WHY one of
    "not-running" (the task does not run here), "cannot-start" (the command), or
    "unavailable" (the relay)."""
    try:
        session = agent.open_session(workload, task, list(command), bool(tty))
    except LookupError as error:
        return {"refused": "not-running", "detail": str(error)}
    except (OSError, ValueError) as error:
        detail = error.strerror if isinstance(error, OSError) and error.strerror else error
        return {"refused": "cannot-start", "detail": str(detail)}
    try:
        ticket = relay.offer(session)
    except (OSError, RuntimeError) as error:
        return {"refused": "unavailable", "detail": str(error)}
    return {"host": ticket.host, "port": ticket.port, "secret": ticket.secret}


def ticket_of(answer: dict[str, Any]) -> Ticket:
    """The Ticket in an answer of open_relayed; LookupError when the task does not run
    there, ValueError when the command cannot start, RuntimeError when the node cannot
    relay it."""
    why = answer.get("refused")
    if why == "not-running":
        raise LookupError(answer["detail"])
    if why == "cannot-start":
        raise ValueError(answer["detail"])
    if why is not None:
        raise RuntimeError(answer.get("detail", why))
    return Ticket(str(answer["host"]), int(answer["port"]), bytes(answer["secret"]))
