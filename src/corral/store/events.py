"""Events: the audit trail of every change, written in the change's own transaction."""

from __future__ import annotations

import time
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from corral.store.bulk import Rows
from corral.store.records import EventRecord
from corral.store.schema import EventRow

# The columns of `event_values`, in its order.
_EVENTS = Rows(
    cast(Table, EventRow.__table__), ("time", "workload", "node", "kind", "cause", "reason")
)


def add_event(
    session: Session,
    kind: str,
    cause: str,
    reason: str,
    workload: str | None = None,
    node: str | None = None,
) -> None:
    """Record one event, timed now."""
    session.add(
        EventRow(
            time=time.time(), workload=workload, node=node, kind=kind, cause=cause, reason=reason
        )
    )


def event_values(
    now: float,
    kind: str,
    cause: str,
    reason: str,
    workload: str | None = None,
    node: str | None = None,
) -> tuple[Any, ...]:
    """One event as the values of a row, for `add_events`."""
    return (now, workload, node, kind, cause, reason)


def add_events(session: Session, values: list[tuple[Any, ...]]) -> None:
    """Many events at once (`event_values`)."""
    _EVENTS.insert(session.connection(), values)


def list_events(session: Session, workload: str | None, limit: int) -> list[EventRecord]:
    """The newest `limit` events (of `workload`, or of all), oldest first."""
    query = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
    if workload is not None:
        query = query.where(EventRow.workload == workload)
    rows = list(reversed(session.scalars(query).all()))
    return [EventRecord(r.id, r.time, r.workload, r.node, r.kind, r.cause, r.reason) for r in rows]
