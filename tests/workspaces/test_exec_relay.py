"""The exec relay of a Ray node's agent (corral.cluster.exec_relay), without Ray: real
commands, a real listener on loopback, and the server's side of the protocol
(corral.workspaces.exec_remote) speaking to it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.agent.exec import ExecSession, spawn
from corral.cluster.exec_relay import (
    CONTROL,
    EXIT,
    IN,
    OK,
    OUT,
    SECRET_BYTES,
    SessionRelay,
    Ticket,
    frame,
    read_frame,
)


class Ended:
    """The sessions the relay released, in order."""

    def __init__(self) -> None:
        self.sessions: list[ExecSession] = []
        self.event = threading.Event()

    def __call__(self, session: ExecSession) -> None:
        self.sessions.append(session)
        self.event.set()


@pytest.fixture
def relay() -> Iterator[tuple[SessionRelay, Ended]]:
    ended = Ended()
    made = SessionRelay("127.0.0.1", ended, claim_seconds=1.0)
    try:
        yield made, ended
    finally:
        made.close()


def start(tmp_path: Path, *command: str, tty: bool = False) -> ExecSession:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    return spawn("w", list(command), env, str(tmp_path), None, tty)


def alive(session: ExecSession) -> bool:
    return session.process.poll() is None


async def claim(ticket: Ticket, secret: bytes | None = None) -> tuple[int, list[tuple[int, bytes]]]:
    """Connect with `secret` (the ticket's by default), send "hello\\n" and end of input,
    and read every frame until the connection ends: the bytes read before the first
    frame's header (should be none), and the frames."""
    reader, writer = await asyncio.open_connection(ticket.host, ticket.port)
    writer.write(ticket.secret if secret is None else secret)
    frames: list[tuple[int, bytes]] = []
    try:
        kind, _ = await asyncio.wait_for(read_frame(reader), 10)
    except asyncio.IncompleteReadError as error:
        writer.close()
        return len(error.partial), frames
    assert kind == OK
    writer.write(frame(IN, b"hello\n") + frame(CONTROL, json.dumps({"eof": True}).encode()))
    while True:
        try:
            frames.append(await asyncio.wait_for(read_frame(reader), 20))
        except asyncio.IncompleteReadError:
            break
    writer.close()
    return 0, frames


def test_the_secret_opens_the_session_once(
    relay: tuple[SessionRelay, Ended], tmp_path: Path
) -> None:
    server, ended = relay
    session = start(tmp_path, "/bin/sh", "-c", "cat; echo done; exit 7")
    ticket = server.offer(session)
    assert ticket.host == "127.0.0.1" and len(ticket.secret) == SECRET_BYTES
    # A stranger's guess: the connection closes without a byte, and the session waits on.
    partial, frames = asyncio.run(claim(ticket, os.urandom(SECRET_BYTES)))
    assert (partial, frames) == (0, [])
    assert alive(session)
    _, frames = asyncio.run(claim(ticket))
    output = b"".join(data for kind, data in frames if kind == OUT)
    assert output == b"hello\ndone\n"
    assert frames[-1] == (EXIT, struct.pack(">i", 7))
    assert ended.event.wait(10) and ended.sessions == [session]
    # The secret was good for one connection.
    assert asyncio.run(claim(ticket)) == (0, [])


def test_an_unclaimed_session_is_killed(relay: tuple[SessionRelay, Ended], tmp_path: Path) -> None:
    server, ended = relay
    session = start(tmp_path, "sleep", "600")
    ticket = server.offer(session)
    assert ended.event.wait(10), "the session was not released after claim_seconds"
    assert session.process.poll() is not None
    assert asyncio.run(claim(ticket)) == (0, [])


def test_a_connection_that_goes_away_kills_its_session(
    relay: tuple[SessionRelay, Ended], tmp_path: Path
) -> None:
    server, ended = relay
    session = start(tmp_path, "sleep", "600")
    ticket = server.offer(session)
    with socket.create_connection((ticket.host, ticket.port)) as conn:
        conn.sendall(ticket.secret)
        assert conn.recv(5) == frame(OK)
    assert ended.event.wait(10) and session.process.poll() is not None


def test_a_silent_connection_is_dropped_and_blocks_nobody(
    relay: tuple[SessionRelay, Ended], tmp_path: Path
) -> None:
    server, _ = relay
    session = start(tmp_path, "/bin/sh", "-c", "echo hi")
    ticket = server.offer(session)
    with socket.create_connection((ticket.host, ticket.port)) as silent:
        # Says nothing; meanwhile the rightful connection gets its session.
        _, frames = asyncio.run(claim(ticket))
        assert (OUT, b"hi\n") in frames and frames[-1] == (EXIT, struct.pack(">i", 0))
        silent.settimeout(30)
        assert silent.recv(1) == b""  # closed after the handshake's time


def test_a_terminal_session_over_the_relay(
    relay: tuple[SessionRelay, Ended], tmp_path: Path
) -> None:
    server, _ = relay
    session = start(tmp_path, sys.executable, "-c", "import os; print(os.ttyname(0))", tty=True)
    ticket = server.offer(session)
    _, frames = asyncio.run(claim(ticket))
    assert b"/dev/pts/" in b"".join(data for kind, data in frames if kind == OUT)
    assert frames[-1][0] == EXIT
