"""A workload's life after submission: cancelling it (or every member of an array),
changing it while it waits, and releasing the workloads whose dependencies are met."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from corral.store.convert import dependency_text, waiting_reason, workload_record, workload_spec
from corral.store.errors import Conflict, NotFound
from corral.store.events import add_event
from corral.store.records import Release, WorkloadRecord
from corral.store.schema import WorkloadRow
from corral.store.tasks import releases

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


def _cancel_row(session: Session, row: WorkloadRow, cause: str, reason: str) -> None:
    row.placements.clear()
    row.status = "cancelled"
    row.reason = reason
    row.cancelled_by = cause
    row.held = False
    row.finished_at = time.time()
    add_event(session, "cancelled", cause, reason, workload=row.name)


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
    add_event(session, "updated", cause, said, workload=name)
    session.flush()
    return workload_record(row, row.queue.name)


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={'|'.join(v)}" for k, v in sorted(value.items()))
    return str(value)


def any_held(session: Session) -> bool:
    """Whether some pending workload waits for its dependencies (an indexed look-up)."""
    found = session.scalar(
        select(WorkloadRow.id)
        .where(WorkloadRow.held.is_(True), WorkloadRow.status == "pending")
        .limit(1)
    )
    return found is not None


def resolve_holds(session: Session) -> list[str]:
    """Look at every pending workload that waits for dependencies: release those whose
    dependencies are all met; give those with a dependency that can no longer be met that
    reason, or cancel them when they asked for it (`kill_on_invalid_dep`). Returns the
    workloads whose state changed (released or cancelled)."""
    rows = session.scalars(
        select(WorkloadRow)
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
    changed = []
    for row in rows:
        spec = workload_spec(row, "")
        broken = None
        waiting = []
        for dependency in spec.after:
            status = statuses.get(dependency.workload)
            if dependency.condition == "ok":
                if status == "succeeded":
                    continue
                if status is None or status in ("failed", "cancelled"):
                    broken = (dependency, status or "deleted")
                    break
            elif status is None or status in ("succeeded", "failed", "cancelled"):
                continue
            waiting.append(dependency)
        if broken is not None:
            dependency, status = broken
            why = f"dependency {dependency.workload} {status}; it can never succeed"
            if row.kill_on_invalid_dep:
                _cancel_row(session, row, SCHEDULER, f"cancelled: {why}")
                changed.append(row.name)
            elif row.reason != f"{why} (cancel or delete this workload)":
                row.reason = f"{why} (cancel or delete this workload)"
        elif not waiting:
            row.held = False
            row.reason = waiting_reason(replace(spec, after=()))
            add_event(session, "released", SCHEDULER, "every dependency is met", workload=row.name)
            changed.append(row.name)
        else:
            reason = "waiting for " + ", ".join(map(dependency_text, waiting))
            if row.reason != reason:
                row.reason = reason
    return changed
