"""A workload's life after submission: cancelling it (or every member of an array),
deleting, suspending and resuming it, changing it while it waits, and releasing the
workloads whose dependencies are met."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session, selectinload

from corral.model.arrays import Dependency
from corral.store.convert import array_reason, dependency_text, workload_record
from corral.store.errors import Conflict, NotFound
from corral.store.events import add_events, add_workload_event, event_values, run_of
from corral.store.records import ACTIVE, Release, WorkloadRecord
from corral.store.schema import WorkloadRow
from corral.store.tasks import releases
from corral.store.workloads import WORKLOADS, workload_row

# What may be cancelled: work that has not ended.
CANCELLABLE = ("pending", "running", "suspended")
# What `update_workload` may change, and only while the workload waits.
MUTABLE = (
    "priority",
    "preemptible",
    "max_runtime",
    "backoff_limit",
    "grace_period",
    "node_selector",
    "node_pools",
)
WAITING = ("pending", "suspended")
# Who cancels a workload whose dependency can no longer be met.
SCHEDULER = "scheduler"


def named_or_array(session: Session, name: str) -> list[WorkloadRow]:
    """The workload `name`, or else every member of the array `name` (by index); NotFound
    when there is neither."""
    query = select(WorkloadRow).options(selectinload(WorkloadRow.placements))
    row = session.scalar(query.where(WorkloadRow.name == name))
    if row is not None:
        return [row]
    members = list(
        session.scalars(
            query.where(WorkloadRow.array_name == name).order_by(WorkloadRow.array_index)
        ).all()
    )
    if not members:
        raise NotFound(f"workload {name!r} not found")
    return members


def cancel(session: Session, name: str, cause: str) -> tuple[list[WorkloadRecord], list[Release]]:
    """Cancel the workload `name`, or every unfinished member of the array `name`: each
    keeps its record as `cancelled`, with who and when. Returns the workloads as they were
    (with the placements they held) and the tasks to stop; Conflict when nothing of it is
    left to cancel."""
    rows = named_or_array(session, name)
    active = [row for row in rows if row.status in CANCELLABLE]
    if not active:
        states = sorted({row.status for row in rows})
        raise Conflict(
            f"workload {name!r} is {' or '.join(states)}; only pending, running or suspended "
            "work can be cancelled (delete removes its record)"
        )
    before = []
    stopped: list[Release] = []
    for row in active:
        before.append(workload_record(row, row.queue.name))
        stopped.extend(releases(row, {p.task for p in row.placements}, f"cancelled by {cause}"))
        _cancel_row(session, row, cause, f"cancelled by {cause}")
    return before, stopped


def delete_workload(
    session: Session, name: str, cause: str
) -> tuple[WorkloadRecord, list[Release]]:
    """Delete a workload and free its devices. Returns what it was and the tasks to stop."""
    row = workload_row(session, name)
    record = workload_record(row, row.queue.name)
    stopped = releases(row, {p.task for p in row.placements}, f"deleted by {cause}")
    # Its events stay (the audit trail), by its id: a later workload of the name has none.
    add_workload_event(session, row, "deleted", cause, "", attempt=run_of(row))
    session.delete(row)
    return record, stopped


def suspend(session: Session, name: str, cause: str) -> tuple[WorkloadRecord, list[Release]]:
    """Take a workload out of scheduling; a running one gives its devices back. Returns
    what it was and the tasks to stop."""
    row = workload_row(session, name)
    if row.status not in ACTIVE:
        raise Conflict(
            f"workload {name!r} is {row.status}; only pending or running work can be suspended"
        )
    record = workload_record(row, row.queue.name)
    stopped = releases(row, {p.task for p in row.placements}, f"suspended by {cause}")
    attempt = run_of(row)
    row.placements.clear()
    row.status = "suspended"
    row.reason = f"suspended by {cause}"
    add_workload_event(session, row, "suspended", cause, "", attempt=attempt)
    return record, stopped


def resume(session: Session, name: str, cause: str) -> WorkloadRecord:
    """Send a suspended workload back to pending."""
    row = workload_row(session, name)
    if row.status != "suspended":
        raise Conflict(f"workload {name!r} is {row.status}, not suspended")
    row.status = "pending"
    row.pending_since = time.time()
    row.reason = None
    add_workload_event(session, row, "resumed", cause, "")
    session.flush()
    return workload_record(row, row.queue.name)


def _cancel_row(session: Session, row: WorkloadRow, cause: str, reason: str) -> None:
    attempt = run_of(row)
    row.placements.clear()
    row.status = "cancelled"
    row.reason = reason
    row.cancelled_by = cause
    row.held = False
    row.finished_at = time.time()
    add_workload_event(session, row, "cancelled", cause, reason, attempt=attempt)


def update_workload(
    session: Session, name: str, changes: dict[str, Any], cause: str
) -> WorkloadRecord:
    """Change fields of a workload that waits (pending or suspended): those of `MUTABLE`.
    Conflict for work that runs or has ended; nothing changes then."""
    row = session.scalar(select(WorkloadRow).where(WorkloadRow.name == name))
    if row is None:
        raise NotFound(f"workload {name!r} not found")
    if row.status not in WAITING:
        raise Conflict(
            f"workload {name!r} is {row.status}; only pending or suspended work can be "
            "changed (cancel it and submit it again)"
        )
    unknown = sorted(set(changes) - set(MUTABLE))
    if unknown:
        raise ValueError(f"{', '.join(unknown)} cannot change")
    for field, value in changes.items():
        setattr(row, field, value)
    said = ", ".join(f"{field}={_shown(value)}" for field, value in sorted(changes.items()))
    add_workload_event(session, row, "updated", cause, said)
    session.flush()
    return workload_record(row, row.queue.name)


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={'|'.join(v)}" for k, v in sorted(value.items()))
    return str(value)


# Every cycle asks it: made once (making the select cost more than running it).
_NEWEST_HELD = select(func.max(WorkloadRow.id)).where(
    WorkloadRow.held.is_(True), WorkloadRow.status == "pending"
)


def newest_held(session: Session) -> int | None:
    """The id of the newest pending workload that waits for its dependencies, or None
    when none does (an indexed look-up)."""
    found: int | None = session.connection().execute(_NEWEST_HELD).scalar()
    return found


def resolve_holds(session: Session) -> list[str]:
    """Look at every pending workload that waits for dependencies: release those whose
    dependencies are all met; give those with a dependency that can no longer be met that
    reason, or cancel them when they asked for it (`kill_on_invalid_dep`). Returns the
    workloads whose state changed (released or cancelled). Plain rows, and statements run
    once for many rows: this runs every cycle while work is held."""
    rows = session.execute(
        select(
            WorkloadRow.id,
            WorkloadRow.name,
            WorkloadRow.after,
            WorkloadRow.reason,
            WorkloadRow.kill_on_invalid_dep,
            WorkloadRow.array_name,
            WorkloadRow.array_limit,
        )
        .where(WorkloadRow.held.is_(True), WorkloadRow.status == "pending")
        .order_by(WorkloadRow.id)
    ).all()
    if not rows:
        return []
    wanted = {name for row in rows for name, _ in row.after or ()}
    statuses = dict(
        session.execute(
            select(WorkloadRow.name, WorkloadRow.status).where(WorkloadRow.name.in_(wanted))
        ).all()
    )
    names = {row.id: row.name for row in rows}
    reasons: list[dict[str, Any]] = []
    released: list[dict[str, Any]] = []
    doomed: dict[int, str] = {}
    for row in rows:
        after = [Dependency(n, "any" if c == "any" else "ok") for n, c in row.after or ()]
        broken, waiting = _verdict(after, statuses)
        if broken is not None:
            why = f"dependency {broken}; it can never succeed"
            if row.kill_on_invalid_dep:
                doomed[row.id] = f"cancelled: {why}"
                continue
            reason: str | None = f"{why} (cancel or delete this workload)"
        elif not waiting:
            array = row.array_name
            later = array_reason(array, row.array_limit) if array is not None else None
            released.append({"workload_id": row.id, "reason": later})
            continue
        else:
            reason = "waiting for " + ", ".join(map(dependency_text, waiting))
        if row.reason != reason:
            reasons.append({"workload_id": row.id, "reason": reason})
    _write(session, reasons, held=True)
    _write(session, released, held=False)
    now = time.time()
    add_events(
        session,
        [
            event_values(
                now,
                "released",
                SCHEDULER,
                "every dependency is met",
                (names[i["workload_id"]], i["workload_id"]),
            )
            for i in released
        ],
    )
    if doomed:
        victims = select(WorkloadRow).where(WorkloadRow.id.in_(doomed)).order_by(WorkloadRow.id)
        for victim in session.scalars(victims):
            _cancel_row(session, victim, SCHEDULER, doomed[victim.id])
    return [names[i["workload_id"]] for i in released] + [names[i] for i in sorted(doomed)]


def _write(session: Session, values: list[dict[str, Any]], held: bool) -> None:
    """Set `reason` (and `held`) of many workloads in one statement."""
    if values:
        session.connection().execute(
            update(WORKLOADS)
            .where(WORKLOADS.c.id == bindparam("workload_id"))
            .values(held=held, reason=bindparam("reason")),
            values,
        )


def _verdict(
    after: list[Dependency], statuses: dict[str, str]
) -> tuple[str | None, list[Dependency]]:
    """What can no longer be met ("NAME failed", "NAME deleted"), or None; and what is
    still awaited."""
    waiting = []
    for dependency in after:
        status = statuses.get(dependency.workload)
        if dependency.condition == "ok":
            if status == "succeeded":
                continue
            if status is None or status in ("failed", "cancelled"):
                return f"{dependency.workload} {status or 'deleted'}", []
        elif status is None or status in ("succeeded", "failed", "cancelled"):
            continue
        waiting.append(dependency)
    return None, waiting
