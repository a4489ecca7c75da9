"""`Idempotency-Key`s of submissions: a key a user sent, the digest of the body it came
with, and the workloads that request created. A key is written in the same transaction
as its workloads, so that a retry after a crash finds either both or neither."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from corral.store.schema import IdempotencyRow

# How long a key is remembered: a retry later than this creates new workloads.
KEY_SECONDS = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Idempotency:
    """The key a request came with: whose, which, and the digest of its body."""

    user: str
    key: str
    digest: str


class Replayed(Exception):
    """The key was seen before: `workloads` are what that request created, and `same` is
    whether it came with the same body."""

    def __init__(self, key: Idempotency, workloads: list[str], same: bool) -> None:
        super().__init__(f"Idempotency-Key {key.key!r} was used before")
        self.key = key
        self.workloads = workloads
        self.same = same


def find(session: Session, keys: list[Idempotency]) -> dict[tuple[str, str], Replayed]:
    """The keys among `keys` used before and not expired, by (user, key). Expired rows of
    these keys are deleted, so that the key can be written again."""
    if not keys:
        return {}
    wanted = {(k.user, k.key): k for k in keys}
    rows = session.scalars(
        select(IdempotencyRow).where(
            IdempotencyRow.key.in_({k.key for k in keys}),
            IdempotencyRow.user.in_({k.user for k in keys}),
        )
    ).all()
    found: dict[tuple[str, str], Replayed] = {}
    expired = time.time() - KEY_SECONDS
    for row in rows:
        key = wanted.get((row.user, row.key))
        if key is None:
            continue
        if row.created_at < expired:
            session.execute(delete(IdempotencyRow).where(IdempotencyRow.id == row.id))
            session.flush()
            continue
        found[(row.user, row.key)] = Replayed(key, list(row.workloads), row.digest == key.digest)
    return found


def remember(session: Session, key: Idempotency, workloads: list[str], at: float) -> None:
    """Write the key with the workloads its request created."""
    session.add(
        IdempotencyRow(
            user=key.user, key=key.key, digest=key.digest, workloads=workloads, created_at=at
        )
    )


def purge(session: Session, now: float) -> int:
    """Delete keys older than KEY_SECONDS; returns how many."""
    result = session.execute(
        delete(IdempotencyRow).where(IdempotencyRow.created_at < now - KEY_SECONDS)
    )
    return int(getattr(result, "rowcount", 0) or 0)
