"""Accounting: allocation intervals, and GPU-hours allocated, used and idle over any period.

An allocation interval opens when a task's placement is written and closes when the
placement goes, whatever removed it (the task's workload ended, was preempted, suspended,
deleted, or sent back to pending because its node went away). Both happen in the same
transaction as the placement change, through session events installed on the store's own
sessions (`install`), so no code path that binds or releases devices through the ORM can
forget them. The scheduler's bulk binding writes placements without the ORM, through
`insert_placements`, which opens their intervals itself in the same statement batch.

Definitions, over a period [since, until):
- allocated: the GPUs each task held (its `gpu`: 2 for two whole devices, 0.5 for half of
  one) times the seconds it held them within the period;
- used: per sample or rollup row, share * utilisation / 100 * seconds;
- idle: the share * seconds of rows (minutes, for rollups) whose utilisation was 0.
Used and idle come from telemetry, so allocated time without samples counts as neither,
and samples count only for the time their task held its devices: what a task did before
its interval opened or after it closed (a grace period to checkpoint) was nobody's
allocation (corral.store.telemetry_reads.gpu_seconds).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from sqlalchemy import (
    Connection,
    Row,
    Table,
    event,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from corral.store.bulk import Rows, chunks, one_of, read_in
from corral.store.database import Database, json_text
from corral.store.records import STATUSES
from corral.store.schema import NodeRow, PlacementRow, QueueRow, WorkloadRow
from corral.store.telemetry_reads import GpuSeconds, gpu_seconds
from corral.store.telemetry_schema import AllocationRow

UsageKey = Literal["workload", "project", "department", "user"]
USAGE_KEYS: tuple[UsageKey, ...] = ("project", "department", "user", "workload")


# -- allocation intervals -----------------------------------------------------------------


# Placements written by the current flush, in the session's info: their intervals are
# opened and closed together once the flush is done (one statement per table, not one per
# placement).
_BOUND = "corral.usage.bound"
_RELEASED = "corral.usage.released"


def install(database: Database) -> None:
    """Open and close allocation intervals in the same flush as the placements, for the
    sessions of `database` only."""
    event.listen(database.sessions, "pending_to_persistent", _placement_bound)
    event.listen(database.sessions, "persistent_to_deleted", _placement_released)
    event.listen(database.sessions, "after_flush_postexec", _write_intervals)


def _placement_bound(session: Session, instance: object) -> None:
    if isinstance(instance, PlacementRow):
        session.info.setdefault(_BOUND, []).append(instance)


def _placement_released(session: Session, instance: object) -> None:
    if isinstance(instance, PlacementRow):
        session.info.setdefault(_RELEASED, []).append(instance.id)


def _write_intervals(session: Session, _context: Any) -> None:
    # Both lists are filled only by a flush that succeeded; they are taken before any
    # statement runs, so that a failure here leaves nothing for the next flush.
    bound: list[PlacementRow] = session.info.pop(_BOUND, [])
    released: list[int] = session.info.pop(_RELEASED, [])
    connection = session.connection()
    now = time.time()
    for ids in chunks(released):
        connection.execute(
            update(AllocationRow)
            .where(AllocationRow.placement_id.in_(ids), AllocationRow.end.is_(None))
            .values(end=now)
        )
    if bound:
        _open_intervals(connection, [Bound.of(row) for row in bound])


@dataclass(frozen=True, slots=True)
class Bound:
    """A placement as written: what its allocation interval is opened from."""

    id: int
    workload_id: int
    task: int
    node_id: int
    devices: list[int]
    gpu: float
    created_at: float

    @classmethod
    def of(cls, row: PlacementRow) -> Bound:
        return cls(
            row.id, row.workload_id, row.task, row.node_id, row.devices, row.gpu, row.created_at
        )


# A placement's row, as `insert_placements` writes it.
_PLACEMENTS = Rows(
    cast(Table, PlacementRow.__table__),
    ("workload_id", "task", "node_id", "devices", "gpu", "created_at", "launch", "state"),
    key=("workload_id", "task"),
)


# What an allocation interval takes from its workload's row: name, user, priority, queue id.
BoundWorkload = tuple[str, str, int, int]


def insert_placements(
    connection: Connection,
    placements: Sequence[tuple[int, int, int, list[int], float, float, int]],
    workloads: Mapping[int, BoundWorkload],
    nodes: Mapping[int, str],
) -> None:
    """Write placements, each (workload id, task, node id, devices, gpu, created_at,
    launch), all at once, and open their allocation intervals with them: the bulk path of
    binding, which a cycle that binds hundreds of tasks takes instead of the ORM (whose
    events it therefore stands in for). `workloads` and `nodes`: what the caller read of
    the placements' workloads (by id) and nodes' names (by id), so that they are not read
    again."""
    if not placements:
        return
    ids = _PLACEMENTS.insert_ids(
        connection,
        [
            (workload, task, node, json_text(devices), gpu, created_at, launch, "bound")
            for workload, task, node, devices, gpu, created_at, launch in placements
        ],
    )
    _open_intervals(
        connection,
        [
            Bound(placement_id, workload, task, node, devices, gpu, created_at)
            for placement_id, (workload, task, node, devices, gpu, created_at, _) in zip(
                ids, placements, strict=True
            )
        ],
        workloads,
        nodes,
    )


# The statements of `_open_intervals`, made once: every cycle that binds runs them.
_BOUND_WORKLOADS = select(
    WorkloadRow.id, WorkloadRow.name, WorkloadRow.user, WorkloadRow.priority, WorkloadRow.queue_id
).where(one_of(WorkloadRow.id, "ids"))
_QUEUES = select(QueueRow.id, QueueRow.name, QueueRow.parent_id)
_BOUND_NODES = select(NodeRow.id, NodeRow.name).where(one_of(NodeRow.id, "ids"))
_ALLOCATIONS = Rows(
    cast(Table, AllocationRow.__table__),
    (
        "placement_id",
        "workload",
        "task",
        "project",
        "departments",
        "user",
        "priority",
        "node",
        "devices",
        "gpu",
        "start",
    ),
)


def _open_intervals(
    connection: Connection,
    bound: list[Bound],
    workloads: Mapping[int, BoundWorkload] | None = None,
    nodes: Mapping[int, str] | None = None,
) -> None:
    if workloads is None:
        workloads = {
            row[0]: tuple(row[1:])
            for row in read_in(connection, _BOUND_WORKLOADS, "ids", {p.workload_id for p in bound})
        }
    if nodes is None:
        nodes = dict(read_in(connection, _BOUND_NODES, "ids", {p.node_id for p in bound}))
    queues = {row.id: row for row in connection.execute(_QUEUES)}
    # A queue's project and departments (as JSON), worked out once per queue.
    paths: dict[int, tuple[str, str]] = {}
    rows = []
    for placement in bound:
        name, user, priority, queue_id = workloads[placement.workload_id]
        path = paths.get(queue_id)
        if path is None:
            names = _queue_path(queues, queue_id)
            path = paths[queue_id] = (names[0], json_text(names[1:]))
        rows.append(
            (
                placement.id,
                name,
                placement.task,
                *path,
                user,
                priority,
                nodes.get(placement.node_id, ""),
                json_text(list(placement.devices)),
                placement.gpu,
                placement.created_at,
            )
        )
    _ALLOCATIONS.insert(connection, rows)


def _queue_path(queues: dict[int, Row[int, str, int | None]], queue_id: int) -> list[str]:
    """The queue's name and its ancestors' names, nearest first."""
    names = []
    current: int | None = queue_id
    while current is not None:
        names.append(queues[current].name)
        current = queues[current].parent_id
    return names


@dataclass(frozen=True, slots=True)
class Allocation:
    """One task holding `gpu` GPUs of `devices` on `node` from `start` to `end` (None while
    it holds them)."""

    workload: str
    task: int
    project: str
    departments: tuple[str, ...]
    user: str
    priority: int
    node: str
    devices: tuple[int, ...]
    gpu: float
    start: float
    end: float | None

    def seconds_within(self, since: float, until: float, now: float) -> float:
        end = self.end if self.end is not None else now
        return max(0.0, min(end, until) - max(self.start, since))

    def keys(self, by: UsageKey) -> tuple[str, ...]:
        if by == "workload":
            return (self.workload,)
        if by == "project":
            return (self.project,)
        if by == "user":
            return (self.user,)
        return self.departments


def _allocation(row: AllocationRow) -> Allocation:
    return Allocation(
        workload=row.workload,
        task=row.task,
        project=row.project,
        departments=tuple(row.departments),
        user=row.user,
        priority=row.priority,
        node=row.node,
        devices=tuple(row.devices),
        gpu=row.gpu,
        start=row.start,
        end=row.end,
    )


def record_allocation(store: Database, allocation: Allocation) -> None:
    """Write an allocation interval as it was (for imports, and for tests that build a
    timeline by hand); intervals of live work are written by the placements themselves."""
    with store.write() as session:
        session.add(
            AllocationRow(
                placement_id=None,
                workload=allocation.workload,
                task=allocation.task,
                project=allocation.project,
                departments=list(allocation.departments),
                user=allocation.user,
                priority=allocation.priority,
                node=allocation.node,
                devices=list(allocation.devices),
                gpu=allocation.gpu,
                start=allocation.start,
                end=allocation.end,
            )
        )


def allocations(store: Database, since: float, until: float) -> list[Allocation]:
    """Every interval that overlaps [since, until), oldest first."""
    with store.read() as session:
        return _allocations(session, since, until)


def _allocations(session: Session, since: float, until: float) -> list[Allocation]:
    rows = session.scalars(
        select(AllocationRow)
        .where(
            AllocationRow.start < until,
            or_(AllocationRow.end.is_(None), AllocationRow.end > since),
        )
        .order_by(AllocationRow.start, AllocationRow.id)
    ).all()
    return [_allocation(row) for row in rows]


def open_allocations(store: Database) -> list[Allocation]:
    """The intervals still open: what every bound task holds now."""
    with store.read() as session:
        rows = session.scalars(
            select(AllocationRow).where(AllocationRow.end.is_(None)).order_by(AllocationRow.id)
        ).all()
        return [_allocation(row) for row in rows]


def _owners(
    session: Session, names: Iterable[str], known: Sequence[Allocation], until: float
) -> dict[str, Allocation]:
    """For each workload name, its latest interval that started before `until`: who owns
    the samples of that workload."""
    owners: dict[str, Allocation] = {}
    for allocation in known:
        owners[allocation.workload] = allocation
    missing = sorted(set(names) - set(owners))
    if missing:
        rows = session.scalars(
            select(AllocationRow)
            .where(AllocationRow.workload.in_(missing), AllocationRow.start < until)
            .order_by(AllocationRow.start, AllocationRow.id)
        ).all()
        for row in rows:
            owners[row.workload] = _allocation(row)
    return owners


# -- GPU-hours ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UsageRow:
    key: str
    gpu_hours_allocated: float
    gpu_hours_used: float
    gpu_hours_idle: float


def usage(
    store: Database,
    since: float,
    until: float,
    by: UsageKey,
    now: float | None = None,
    projects: Collection[str] | None = None,
) -> list[UsageRow]:
    """GPU-hours allocated, used and idle in [since, until), by workload, project,
    department (every ancestor queue of the project) or user; largest allocation first.
    A project outside any department has no department row. With `projects`, only the
    work of those projects counts (what a member may read)."""
    if by not in USAGE_KEYS:
        raise ValueError(f"by must be one of {', '.join(USAGE_KEYS)}, not {by!r}")
    now = time.time() if now is None else now
    with store.read() as session:
        held = _allocations(session, since, until)
        if projects is not None:
            held = [allocation for allocation in held if allocation.project in projects]
        allocated: dict[str, float] = defaultdict(float)
        for allocation in held:
            seconds = allocation.seconds_within(since, until, now)
            for key in allocation.keys(by):
                allocated[key] += allocation.gpu * seconds
        per_workload = {
            workload: amounts
            for (_, workload), amounts in gpu_seconds(session, since, until).items()
        }
        owners = _owners(session, per_workload, held, until)
    used: dict[str, GpuSeconds] = defaultdict(GpuSeconds)
    for workload, amounts in per_workload.items():
        owner = owners.get(workload)
        if owner is None or (projects is not None and owner.project not in projects):
            continue
        for key in owner.keys(by):
            used[key].used += amounts.used
            used[key].idle += amounts.idle
    rows = [
        UsageRow(
            key,
            _hours(allocated.get(key, 0.0)),
            _hours(used[key].used if key in used else 0.0),
            _hours(used[key].idle if key in used else 0.0),
        )
        for key in set(allocated) | set(used)
    ]
    return sorted(rows, key=lambda row: (-row.gpu_hours_allocated, row.key))


def _hours(seconds: float) -> float:
    return round(seconds / 3600.0, 6)


# -- series ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """GPUs allocated and used on average over [time, time + step)."""

    time: float
    allocated: float
    used: float


def series(
    store: Database,
    since: float,
    until: float,
    step: float,
    *,
    by: UsageKey | None = None,
    now: float | None = None,
) -> dict[str | None, list[SeriesPoint]]:
    """Average GPUs allocated and used per step-long bucket of [since, until): for the whole
    cluster (key None) or by project, department, user or workload."""
    now = time.time() if now is None else now
    buckets = max(1, int(-(-(until - since) // step)))
    starts = [since + i * step for i in range(buckets)]
    allocated: dict[str | None, list[float]] = defaultdict(lambda: [0.0] * buckets)
    used: dict[str | None, list[float]] = defaultdict(lambda: [0.0] * buckets)
    with store.read() as session:
        held = _allocations(session, since, until)
        for allocation in held:
            keys: tuple[str | None, ...] = (None,) if by is None else allocation.keys(by)
            end = min(allocation.end if allocation.end is not None else now, until)
            first = max(0, int((max(allocation.start, since) - since) // step))
            for index in range(first, buckets):
                begin = starts[index]
                if begin >= end:
                    break
                overlap = min(end, begin + step) - max(allocation.start, begin)
                if overlap > 0:
                    for key in keys:
                        allocated[key][index] += allocation.gpu * overlap / step
        seconds = gpu_seconds(session, since, until, step=step, fine=step < 60)
        owners = _owners(session, {workload for _, workload in seconds}, held, until) if by else {}
    for (bucket, workload), amounts in seconds.items():
        assert bucket is not None
        index = min(round((bucket - since) / step), buckets - 1)
        if by is None:
            used[None][index] += amounts.used / step
            continue
        owner = owners.get(workload)
        for key in owner.keys(by) if owner else ():
            used[key][index] += amounts.used / step
    result: dict[str | None, list[SeriesPoint]] = {}
    for key in sorted(set(allocated) | set(used) | ({None} if by is None else set()), key=str):
        result[key] = [
            SeriesPoint(starts[i], round(allocated[key][i], 6), round(used[key][i], 6))
            for i in range(buckets)
        ]
    return result


def workload_counts(store: Database) -> dict[str, int]:
    """How many workloads there are of each status (every status listed, 0 included)."""
    with store.read() as session:
        found = dict(
            session.execute(
                select(WorkloadRow.status, func.count()).group_by(WorkloadRow.status)
            ).all()
        )
    return {status: int(found.get(status, 0)) for status in STATUSES}
