"""The audit records of sessions that enter a workload's task: `corral exec` and `corral
shell` (method EXEC) and each connection of `corral port-forward` (FORWARD).

A session is a WebSocket, which the audit middleware of writes (corral.api.audit) does
not see, and which lasts: its record is written when it opens, before its streams reach
the client (status 101, with who, the workload, the task and the command), and completed
when it ends (when, and the command's exit code). A session refused before it opens is
recorded with the status it was refused with. A server that stops while a session runs
leaves its record without an end.

A failure to write a record is logged, not raised, as for writes: the session is the
user's, and the record's absence is in the server's log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import WebSocket
from starlette.concurrency import run_in_threadpool

from corral.store import Store
from corral.store.audit import AuditRecord

log = logging.getLogger("corral.audit")

EXEC = "EXEC"
FORWARD = "FORWARD"
# The status of a session that opened: the WebSocket's answer, Switching Protocols.
OPENED = 101
# The most of a command a record keeps, in characters: a command may be 4096 arguments of
# 64 KiB, which the audit log is not there to store.
MAX_COMMAND = 8192


def recorded(command: Sequence[str]) -> tuple[str, ...]:
    """`command` as its record keeps it: whole up to MAX_COMMAND characters; beyond, cut
    there, and a last word saying how many characters were left out."""
    kept: list[str] = []
    room = MAX_COMMAND
    for index, argument in enumerate(command):
        if len(argument) > room:
            left = len(argument) - room + sum(len(rest) for rest in command[index + 1 :])
            return (*kept, argument[:room], f"[{left} more characters]")
        kept.append(argument)
        room -= len(argument)
    return tuple(kept)


@dataclass
class SessionAudit:
    """One session's record, filled in as the session goes."""

    store: Store
    record: AuditRecord
    id: int | None = None

    @classmethod
    def of(cls, websocket: WebSocket, method: str, workload: str) -> SessionAudit:
        """The record of a session asked for now on `websocket`, about `workload`."""
        scope = websocket.scope
        route: str = getattr(scope.get("route"), "path", None) or scope["path"]
        client = websocket.client
        record = AuditRecord(
            at=time.time(),
            user=None,
            method=method,
            route=route[:255],
            path=scope["path"][:1024],
            address=client.host[:64] if client else None,
            status=0,
            workload=workload[:127],
        )
        return cls(websocket.app.state.store, record)

    def about(self, **fields: Any) -> None:
        """What became known of the session: `user`, `task`, `command`."""
        self.record = replace(self.record, **fields)

    async def refused(self, status: int) -> None:
        """The session was refused with `status`, before it opened."""
        refused = replace(self.record, status=status)
        await self._write(lambda: self.store.add_session(refused))

    async def opened(self) -> None:
        """The session opened: recorded before its streams reach the client."""
        self.record = replace(self.record, status=OPENED)
        opened = self.record

        def write() -> None:
            self.id = self.store.add_session(opened)

        await self._write(write)

    async def ended(self, exit_code: int | None) -> None:
        """The session is over, with its command's exit code (None: it ended otherwise)."""
        if self.id is None:
            return
        record_id, now = self.id, time.time()
        await self._write(lambda: self.store.end_session(record_id, now, exit_code))

    async def _write(self, write: Callable[[], object]) -> None:
        try:
            await run_in_threadpool(write)
        except Exception:
            log.exception("the audit record of a session was not written: %s", self.record)
