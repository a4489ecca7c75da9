"""Events: the audit trail of every change, written in the change's own transaction.

A workload's events carry its id as well as its name, and are read by the id: a workload
that takes the name of a deleted one starts with no events, and the deleted one's stay
in the table. Each event of a run carries its attempt (see `EventRow.attempt`)."""

from __future__ import annotations

import time
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from corral.store.bulk import Rows
from corral.store.records import EventRecord
from corral.store.schema import EventRow, WorkloadRow

# The columns of `event_values`, in its order.
_EVENTS = Rows(
    cast(Table, EventRow.__table__),
    ("time", "workload", "workload_id", "attempt", "node", "kind", "cause", "reason"),
)


def add_event(
    session: Session, kind: str, cause: str, reason: str, node: str | None = None
) -> None:
    """Record one event that concerns no workload (a node's, a queue's, a user's), timed
    now."""
    session.add(EventRow(time=time.time(), node=node, kind=kind, cause=cause, reason=reason))


def add_workload_event(
    session: Session,
    row: WorkloadRow,
    kind: str,
    cause: str,
    reason: str,
    node: str | None = None,
    attempt: int | None = None,
) -> None:
    """Record one event of the workload `row`, timed now; `attempt`: the run it belongs
    to (`run_of`), None when it belongs to none."""
    session.add(
        EventRow(
            time=time.time(),
            workload=row.name,
            workload_id=row.id,
            attempt=attempt,
            node=node,
            kind=kind,
            cause=cause,
            reason=reason,
        )
    )


def run_of(row: WorkloadRow) -> int | None:
    """The attempt of a running workload, None when it does not run: the attempt an event
    written now belongs to (read before the event's change of status)."""
    return row.attempts if row.status == "running" else None


def event_values(
    now: float,
    kind: str,
    cause: str,
    reason: str,
    workload: tuple[str, int] | None = None,
    node: str | None = None,
    attempt: int | None = None,
) -> tuple[Any, ...]:
    """One event as the values of a row, for `add_events`; `workload`: its name and id."""
    name, workload_id = workload if workload is not None else (None, None)
    return (now, name, workload_id, attempt, node, kind, cause, reason)


def add_events(session: Session, values: list[tuple[Any, ...]]) -> None:
    """Many events at once (`event_values`)."""
    _EVENTS.insert(session.connection(), values)


def list_events(session: Session, workload_id: int | None, limit: int) -> list[EventRecord]:
    """The newest `limit` events (of the workload with id `workload_id`, or of all),
    oldest first."""
    query = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
    if workload_id is not None:
        query = query.where(EventRow.workload_id == workload_id)
    rows = list(reversed(session.scalars(query).all()))
    return [
        EventRecord(r.id, r.time, r.workload, r.node, r.kind, r.cause, r.reason, r.attempt)
        for r in rows
    ]
