"""The audit log of writes: a pure ASGI middleware that records every write request (who,
what, when, from which address, the status it was answered with), and the writer that
commits the records in batches.

Durability: a write's answer is held back until its audit record is committed. The
records are group-committed by one thread (`GroupWriter`), so under load one transaction
carries the records of every write that finished meanwhile: a submission costs no
transaction of its own for its audit. What a crash can lose is the record of a write
whose change committed but whose answer was never sent: the client saw no success (and
may retry it, with an Idempotency-Key safely); an acknowledged write is always audited.

The same middleware applies the per-token rate limit on writes (429), which is audited
too, before the application sees the request.
"""

from __future__ import annotations

import logging
import time

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api import tokens_cache
from corral.api.rate_limit import RateLimiter, retry_after
from corral.control.group_commit import GroupWriter
from corral.store import Store
from corral.store.audit import AuditRecord

log = logging.getLogger("corral.audit")
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Idempotency-Keys older than a day are purged by the audit writer this often.
PURGE_SECONDS = 3600.0


class AuditLog:
    """Audit records queued by requests, committed in batches by one thread."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._writer: GroupWriter[AuditRecord, None] = GroupWriter("corral-audit", self._write)
        self._purged = time.monotonic()

    async def record(self, record: AuditRecord) -> None:
        """Return once `record` is committed. A failure to write it is logged, not raised:
        the write it records has happened, and its answer is still given."""
        try:
            await self._writer.put(record)
        except Exception:
            log.exception("audit record not written: %s", record)

    def stop(self) -> None:
        """Write what is queued, then end the writer."""
        self._writer.stop()

    def _write(self, batch: list[AuditRecord]) -> list[Exception | None]:
        try:
            self.store.add_audit(batch)
        except Exception as error:
            return [error] * len(batch)
        # Housekeeping on a thread that already writes: expired Idempotency-Keys.
        if time.monotonic() - self._purged > PURGE_SECONDS:
            self._purged = time.monotonic()
            try:
                self.store.purge_idempotency()
            except Exception:
                log.exception("purging expired Idempotency-Keys failed")
        return [None] * len(batch)


# Keys of the request's state: when the request came (its record's time), and the status
# of the record its handler wrote itself.
AT = "corral.audit.at"
AUDITED = "corral.audit.written"
# The workspace proxy's paths (corral.workspaces.proxy).
PROXIED = "/w/"


class Audit:
    """Record every write request in the audit log before its answer is sent, and refuse
    writes over their token's rate limit with 429."""

    def __init__(self, app: ASGIApp, log: AuditLog, limiter: RateLimiter | None) -> None:
        self.app = app
        self.log = log
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WRITES:
            await self.app(scope, receive, send)
            return
        at = time.time()
        token = _bearer(scope)
        if self.limiter is not None and token is not None:
            wait = self.limiter.take(token)
            if wait > 0:
                # The token is looked up (cached, so mostly without the database) to
                # name who was refused; an unknown one is recorded with no user.
                known = await tokens_cache.of(self.log.store).user(token)
                await self.log.record(_record(scope, at, known.name if known else None, 429))
                response = JSONResponse(
                    {"detail": f"too many writes with this token; retry in {wait:.1f} s"},
                    status_code=429,
                    headers={"Retry-After": retry_after(wait)},
                )
                await response(scope, receive, send)
                return
        if scope["path"].startswith(PROXIED):
            await self._passed_on(scope, receive, send, at)
            return
        held: list[Message] = []
        status = 500
        # A handler that writes the record in its own transaction (`record_of`, as a
        # submission does) marks it here with the status it answers.
        state = scope.setdefault("state", {})
        state[AT] = at

        async def hold(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            held.append(message)

        try:
            await self.app(scope, receive, hold)
        finally:
            if state.get(AUDITED) != status:
                # Set by `corral.api.deps.current_user` once the token is known.
                user = state.get("user")
                await self.log.record(_record(scope, at, user.name if user else None, status))
        for message in held:
            await send(message)

    async def _passed_on(self, scope: Scope, receive: Receive, send: Send, at: float) -> None:
        """A write through the workspace proxy, recorded once answered: its answer streams
        from the workload as it comes, and holding it here would hold all of it."""
        status = 500

        async def passing(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, passing)
        finally:
            user = scope.get("state", {}).get("user")
            await self.log.record(_record(scope, at, user.name if user else None, status))


def record_of(scope: Scope, user: str, status: int) -> AuditRecord:
    """The audit record of the write request `scope` answered with `status`, for its
    handler to write in the same transaction as its change; the handler then calls
    `written` so that the middleware writes no second one."""
    return _record(scope, scope.get("state", {}).get(AT, time.time()), user, status)


def written(scope: Scope, record: AuditRecord) -> None:
    """Tell the middleware that `record` is committed with the request's change: it
    writes none unless the request is answered with another status."""
    scope.setdefault("state", {})[AUDITED] = record.status


def _bearer(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            return credentials.strip() if scheme.lower() == "bearer" else None
    return None


def _record(scope: Scope, at: float, user: str | None, status: int) -> AuditRecord:
    route = scope.get("route")
    path: str = scope["path"]
    client = scope.get("client")
    return AuditRecord(
        at=at,
        user=user,
        method=scope["method"],
        route=getattr(route, "path", path)[:255],
        path=path[:1024],
        address=client[0][:64] if client else None,
        status=status,
    )
