"""`corral exec` and `corral shell` on an agent in another process (a Ray node's): the
agent starts the command and offers its streams on its node's relay (see
corral.cluster.exec_relay); this side claims them with the one-time secret and carries
them over the client's WebSocket, in the same frames as a local session.

Nothing is accepted before the relay has taken the secret: a node that cannot be
reached is a 502 to the client, before its WebSocket opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from corral.api.threads import run_waiting
from corral.cluster.exec_relay import (
    CONTROL,
    ERR,
    EXIT,
    IN,
    MAX_CONTROL,
    OK,
    OUT,
    Ticket,
    frame,
    read_frame,
)
from corral.workspaces.access import Refused, Watch
from corral.workspaces.proxy import until_one_ends

# Seconds to reach a node's relay and have its answer to the secret.
CONNECT_SECONDS = 10.0
# Input goes to the node in pieces of at most this size (a frame's limit is larger).
PIECE = 64 * 1024
STREAM_TAG = {OUT: b"\x01", ERR: b"\x02"}


class Relayed:
    """A claimed session on a node's relay: its connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def bridge(self, websocket: WebSocket, watch: Watch) -> int | None:
        """Carry the session over the client's accepted WebSocket: `bridge_relayed`."""
        return await bridge_relayed(websocket, self, watch)

    async def close(self) -> None:
        """Close the connection: the node kills the session if it still runs."""
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


async def open_relayed(
    opener: Any, node: str, name: str, task: int, command: list[str], tty: bool
) -> Relayed:
    """Ask the node's agent for the session (`opener`, the cluster's
    open_remote_session) and claim it; Refused, with the local path's statuses, when
    the task does not run there (409), the command cannot start (400) or the node
    cannot be reached (502)."""
    try:
        ticket: Ticket = await run_waiting(opener, node, name, task, command, tty)
    except LookupError as error:
        raise Refused(409, str(error)) from None
    except ValueError as error:
        raise Refused(400, f"cannot start {command[0]!r}: {error}") from None
    except RuntimeError as error:
        raise Refused(502, str(error)) from None
    writer = None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(ticket.host, ticket.port), CONNECT_SECONDS
        )
        writer.write(ticket.secret)
        await writer.drain()
        kind, _ = await asyncio.wait_for(read_frame(reader), CONNECT_SECONDS)
        if kind != OK:
            raise ValueError(f"unexpected frame {kind}")
    except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as error:
        if writer is not None:
            writer.close()
        raise Refused(502, f"the exec relay of node {node} did not answer: {error!r}") from None
    return Relayed(reader, writer)


async def bridge_relayed(websocket: WebSocket, relayed: Relayed, watch: Watch) -> int | None:
    """Carry the session between the client's (accepted) WebSocket and the node until
    the command ends (its exit code goes to the client, then the socket closes, and is
    returned), either side goes away or `watch` ends (its user lost access): then None."""
    code: int | None = None

    async def outbound() -> None:
        nonlocal code
        while True:
            try:
                kind, data = await read_frame(relayed.reader)
            except (asyncio.IncompleteReadError, ValueError, OSError):
                return
            if kind in STREAM_TAG:
                await websocket.send_bytes(STREAM_TAG[kind] + data)
            elif kind == EXIT and len(data) == 4:
                (code,) = struct.unpack(">i", data)
                await websocket.send_text(json.dumps({"exit": code}))
                return

    async def inbound() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            text = message.get("text")
            if data is not None:
                for start in range(0, len(data), PIECE):
                    relayed.writer.write(frame(IN, data[start : start + PIECE]))
                    await relayed.writer.drain()
            elif text is not None and len(text) <= MAX_CONTROL:
                relayed.writer.write(frame(CONTROL, text.encode()))
                await relayed.writer.drain()

    try:
        await until_one_ends(outbound(), inbound(), watch())
    except (WebSocketDisconnect, OSError):
        pass
    finally:
        await relayed.close()
        with contextlib.suppress(Exception):
            await websocket.close(1000)
    return code
