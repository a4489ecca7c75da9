"""Job history (like Slurm's sacct): every workload the store keeps, finished or not, with
what it cost: GPU-hours from the allocation intervals, and evictions from the events."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, selectinload

from corral.store.convert import workload_record
from corral.store.records import WorkloadRecord
from corral.store.schema import EventRow, PlacementRow, QueueRow, WorkloadRow
from corral.store.telemetry_schema import AllocationRow

# The most rows one history query returns (the newest ones).
HISTORY_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """Filters of a history query; None is no filter. `projects`: only these (what the
    caller may read). `since`: work submitted or ended at or after it, and unfinished
    work."""

    project: str | None = None
    user: str | None = None
    state: str | None = None
    since: float | None = None
    projects: Collection[str] | None = None
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    workload: WorkloadRecord
    gpu_seconds: float
    evictions: int


def history(session: Session, query: HistoryQuery, now: float) -> list[HistoryRecord]:
    """The newest `query.limit` workloads that pass the filters, oldest first."""
    select_rows = (
        select(WorkloadRow, QueueRow.name)
        .join(QueueRow, WorkloadRow.queue_id == QueueRow.id)
        .options(
            selectinload(WorkloadRow.task_groups),
            selectinload(WorkloadRow.placements).selectinload(PlacementRow.node),
        )
        .order_by(WorkloadRow.id.desc())
        .limit(min(query.limit, HISTORY_LIMIT))
    )
    if query.project is not None:
        select_rows = select_rows.where(QueueRow.name == query.project)
    if query.projects is not None:
        select_rows = select_rows.where(QueueRow.name.in_(sorted(query.projects)))
    if query.user is not None:
        select_rows = select_rows.where(WorkloadRow.user == query.user)
    if query.state is not None:
        select_rows = select_rows.where(WorkloadRow.status == query.state)
    if query.since is not None:
        select_rows = select_rows.where(
            or_(
                WorkloadRow.created_at >= query.since,
                WorkloadRow.finished_at >= query.since,
                WorkloadRow.finished_at.is_(None),
            )
        )
    found = [workload_record(row, queue) for row, queue in session.execute(select_rows).all()]
    found.reverse()
    if not found:
        return []
    names = {record.name for record in found}
    born = {record.name: record.created_at for record in found}
    # A name may have been used by a workload deleted before this one: only what happened
    # since this one was submitted counts (allocation intervals are kept by name).
    seconds = dict.fromkeys(names, 0.0)
    for name, gpu, start, end in session.execute(
        select(
            AllocationRow.workload, AllocationRow.gpu, AllocationRow.start, AllocationRow.end
        ).where(AllocationRow.workload.in_(names))
    ):
        if start >= born[name]:
            seconds[name] += gpu * max(0.0, (end if end is not None else now) - start)
    evictions = dict.fromkeys((record.id for record in found), 0)
    for evicted in session.scalars(
        select(EventRow.workload_id).where(
            EventRow.workload_id.in_(evictions), EventRow.kind == "preempted"
        )
    ):
        if evicted is not None:
            evictions[evicted] += 1
    return [HistoryRecord(record, seconds[record.name], evictions[record.id]) for record in found]
