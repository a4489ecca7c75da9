"""What the scheduler reads (the snapshot) and writes (a cycle's decisions)."""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, Select, and_, bindparam, case, func, select, update
from sqlalchemy.orm import Session, selectinload

from corral.model import Decisions, Node, Placement, Snapshot, TaskGroup, Topology, Workload
from corral.model.durations import lost_work_phrase
from corral.store.bulk import chunks, each_chunk, one_of, read_in
from corral.store.convert import queue_from_row
from corral.store.events import add_events, add_workload_event, event_values
from corral.store.records import ACTIVE, Release
from corral.store.schema import (
    DeviceRow,
    NodeRow,
    PlacementRow,
    QueueRow,
    WorkloadRow,
)
from corral.store.tasks import group_rows, releases, task_groups_query
from corral.store.telemetry_reads import idle_workloads
from corral.store.usage import insert_placements
from corral.store.workloads import WORKLOADS

# A running workload whose GPUs were at 0% this long counts as idle for victim choice.
IDLE_WINDOW = 300.0

# The statements of every cycle are made once, with bind parameters: making a select and
# its cache key cost ten times what running it did, and a cycle that binds one workload
# was mostly that.
_ACTIVE = and_(WorkloadRow.status.in_(ACTIVE), WorkloadRow.held.is_(False))
_AFTER = WorkloadRow.id > bindparam("after")
_UP_TO = WorkloadRow.id <= bindparam("up_to")
_NAMED = one_of(WorkloadRow.name, "names")


@dataclass(frozen=True, slots=True)
class _Reads:
    """The selects of active workloads: their rows (that pass `first`), and the task
    groups and placements of those rows (`span`, up to the newest row read)."""

    workloads: Select[*tuple[Any, ...]]
    groups: Select[*tuple[Any, ...]]
    placements: Select[*tuple[Any, ...]]

    @classmethod
    def of(cls, first: tuple[Any, ...], span: tuple[Any, ...]) -> _Reads:
        workloads = (
            select(
                WorkloadRow.id,
                WorkloadRow.name,
                WorkloadRow.status,
                WorkloadRow.array_name,
                WorkloadRow.array_limit,
                QueueRow.name.label("queue"),
                WorkloadRow.priority,
                WorkloadRow.preemptible,
                WorkloadRow.min_available,
                WorkloadRow.node_selector,
                WorkloadRow.node_pools,
                WorkloadRow.topology_key,
                WorkloadRow.topology_required,
                WorkloadRow.checkpoint_at,
                WorkloadRow.max_runtime,
                WorkloadRow.created_at,
                WorkloadRow.pending_since,
            )
            .join(QueueRow, WorkloadRow.queue_id == QueueRow.id)
            .where(*first)
            .order_by(WorkloadRow.id)
        )
        placements = (
            select(
                PlacementRow.workload_id,
                PlacementRow.task,
                NodeRow.name,
                PlacementRow.devices,
                PlacementRow.gpu,
                PlacementRow.created_at,
            )
            .join(WorkloadRow, PlacementRow.workload_id == WorkloadRow.id)
            .join(NodeRow, PlacementRow.node_id == NodeRow.id)
            .where(*span)
            .order_by(PlacementRow.workload_id, PlacementRow.task)
        )
        return cls(workloads, task_groups_query(*span), placements)


# By id: those submitted after `after` (up to `up_to`, the newest read, for the rest).
_BY_ID = _Reads.of((_ACTIVE, _AFTER), (_ACTIVE, _AFTER, _UP_TO))
# By name: those among `names` up to `up_to`.
_BY_NAME = _Reads.of((_ACTIVE, _NAMED, _UP_TO), (_ACTIVE, _NAMED, _UP_TO))
# What `apply` writes with.
_FOUND = select(
    WorkloadRow.id,
    WorkloadRow.name,
    WorkloadRow.status,
    WorkloadRow.reason,
    WorkloadRow.launches,
    # The attempt a binding starts, or goes on with (an elastic workload that grows).
    WorkloadRow.attempts,
    # For the allocation intervals of those bound (`usage.insert_placements`).
    WorkloadRow.user,
    WorkloadRow.priority,
    WorkloadRow.queue_id,
).where(_NAMED)
_RUNNING_MEMBERS = (
    select(WorkloadRow.array_name, func.count())
    .where(
        one_of(WorkloadRow.array_name, "arrays"),
        WorkloadRow.status == "running",
    )
    .group_by(WorkloadRow.array_name)
)
_NODE_IDS = select(NodeRow.name, NodeRow.id).where(one_of(NodeRow.name, "names"))
_REASON = (
    update(WORKLOADS)
    .where(WORKLOADS.c.id == bindparam("workload_id"))
    .values(reason=bindparam("reason"))
)
# Every workload bound by a cycle is bound at the same time: one statement for them all.
_BOUND = (
    update(WORKLOADS)
    .where(one_of(WORKLOADS.c.id, "ids"))
    .values(
        status="running",
        reason=None,
        started_at=func.coalesce(WORKLOADS.c.started_at, bindparam("now")),
        attempts=case(
            (WORKLOADS.c.status == "running", WORKLOADS.c.attempts),
            else_=WORKLOADS.c.attempts + 1,
        ),
        launches=WORKLOADS.c.launches + 1,
    )
)


def read_snapshot(session: Session) -> tuple[Snapshot, int]:
    """Pending and running work, every queue and node, as the engine reads them; and the
    newest workload id read (see `new_workloads`)."""
    queues = session.scalars(select(QueueRow).order_by(QueueRow.id)).all()
    names = {row.id: row.name for row in queues}
    nodes = _nodes(session)
    # Victims whose GPUs sat idle are preferred among otherwise equal ones.
    idle = idle_workloads(session, time.time(), IDLE_WINDOW)
    workloads, newest = active_workloads(session, idle, after=0)
    snapshot = Snapshot(
        nodes=tuple(nodes),
        queues=tuple(queue_from_row(row, names) for row in queues),
        workloads=workloads,
    )
    return snapshot, newest


def _nodes(session: Session) -> list[Node]:
    # Plain rows and a count of devices, not ORM objects: this runs every cycle.
    connection = session.connection()
    gpus = dict(
        connection.execute(
            select(DeviceRow.node_id, func.count()).group_by(DeviceRow.node_id)
        ).all()
    )
    return [
        Node(
            name=row.name,
            gpus=gpus.get(row.id, 0),
            gpu_memory=row.gpu_memory,
            gpu_model=row.gpu_model,
            cpu=row.cpu,
            memory=row.memory,
            labels=row.labels,
            schedulable=row.schedulable and row.state == "ready",
        )
        for row in connection.execute(
            select(
                NodeRow.id,
                NodeRow.name,
                NodeRow.gpu_model,
                NodeRow.gpu_memory,
                NodeRow.cpu,
                NodeRow.memory,
                NodeRow.labels,
                NodeRow.schedulable,
                NodeRow.state,
            ).order_by(NodeRow.name)
        )
    ]


def new_workloads(session: Session, after: int) -> tuple[tuple[Workload, ...], int]:
    """Active workloads with an id above `after`, and the newest id read."""
    return active_workloads(session, set(), after)


def named_workloads(session: Session, names: Collection[str], up_to: int) -> tuple[Workload, ...]:
    """The active workloads among `names` with an id up to `up_to`, by id."""
    return active_workloads(session, set(), 0, (list(names), up_to))[0]


def active_workloads(
    session: Session,
    idle: set[str],
    after: int,
    named: tuple[list[str], int] | None = None,
) -> tuple[tuple[Workload, ...], int]:
    """Pending and running workloads with an id above `after`, or (`named`) those among
    the names with an id up to the bound given, as the engine reads them; and the newest
    id among them (`after` when there is none). Plain rows of statements made once, only
    the columns the engine reads: this runs every cycle."""
    # Work that waits for its dependencies is left out until they are met
    # (`lifecycle.resolve_holds`).
    connection = session.connection()
    reads, given = (_BY_ID, {"after": after}) if named is None else (_BY_NAME, {"up_to": named[1]})

    def fetch(
        statement: Select[*tuple[Any, ...]], params: dict[str, Any]
    ) -> list[Row[*tuple[Any, ...]]]:
        # Fetched whole, not row by row (fetchone a row): a full read has one for every
        # task. Names by chunks: any number of workloads may have changed.
        if named is None:
            return list(connection.execute(statement, params).all())
        return read_in(connection, statement, "names", named[0], **params)

    rows = fetch(reads.workloads, given)
    if not rows:
        return (), after
    if named is not None:
        rows.sort(key=lambda row: row.id)  # by id across the chunks
    # Task groups and placements of the workloads just read, and of no later ones: a
    # workload and its task groups are committed together, so every row read has its own.
    newest: int = rows[-1].id
    rows = _within_array_limits(connection, rows)
    span = {**given, "up_to": newest}
    groups = group_rows(fetch(reads.groups, span))
    # A pending workload holds no devices (whatever makes one pending frees them): the
    # workloads submitted since the last cycle, as a rule all pending, need no placements.
    running = any(row.status != "pending" for row in rows)
    placed, started = _placements(fetch(reads.placements, span)) if running else ({}, {})
    now = time.time()
    workloads = tuple(_workload(row, groups, placed, started, idle, now) for row in rows)
    return workloads, newest


def _workload(
    row: Row[*tuple[Any, ...]],
    groups: dict[int, list[TaskGroup]],
    placed: dict[int, list[Placement]],
    started: dict[int, float],
    idle: set[str],
    now: float,
) -> Workload:
    """A row of `_Reads.workloads` as the engine reads it. The row is unpacked, not read
    by column names: that cost ten times as much (5 us a row, 50 ms of a full read of
    10,000 workloads)."""
    (
        id_,
        name,
        status,
        _,
        _,
        queue,
        priority,
        preemptible,
        min_available,
        node_selector,
        node_pools,
        topology_key,
        topology_required,
        checkpoint_at,
        max_runtime,
        created_at,
        pending_since,
    ) = row
    return Workload(
        name=name,
        queue=queue,
        task_groups=tuple(groups.get(id_, ())),
        priority=priority,
        preemptible=preemptible,
        min_available=min_available,
        node_selector={k: tuple(v) for k, v in node_selector.items()},
        topology=(Topology(topology_key, topology_required) if topology_key else None),
        node_pools=tuple(node_pools or ()),
        submitted=float(id_),
        placements=tuple(placed.get(id_, ())),
        idle=name in idle,
        # For min-runtime: since its running tasks were bound (a restart starts anew).
        running_for=max(now - started[id_], 0.0) if id_ in started else None,
        since_checkpoint=_since_checkpoint(now, started.get(id_), checkpoint_at),
        max_runtime=max_runtime,
        # For reservations: since it last became pending.
        waiting_for=None if status != "pending" else max(now - (pending_since or created_at), 0.0),
    )


def _since_checkpoint(now: float, started: float | None, checkpoint: float | None) -> float | None:
    """Seconds of work a running workload would lose if evicted now: since its last
    checkpoint, or since its run started when that was later (the work before it was
    lost or kept already) or no checkpoint is known; None when it does not run."""
    if started is None:
        return None
    since = started if checkpoint is None else max(started, checkpoint)
    return max(now - since, 0.0)


def _within_array_limits(
    connection: Connection, rows: Sequence[Row[*tuple[Any, ...]]]
) -> list[Row[*tuple[Any, ...]]]:
    """The rows less the pending members of arrays beyond their running limit: of an
    array with limit k and r members running, only its first k - r pending members (by
    index, which is by id) are offered to the engine. The same rule on a full read and
    on the workloads read since (`new_workloads`) gives the same snapshot."""
    # By position (the array's name and limit), not by name: every row is looked at.
    limited = {row[3] for row in rows if row[4] is not None}
    if not limited:
        return list(rows)
    running = dict(read_in(connection, _RUNNING_MEMBERS, "arrays", limited))
    offered: dict[str, int] = {}
    kept = []
    for row in rows:
        if row.array_limit is not None and row.status == "pending":
            count = offered.get(row.array_name, 0)
            if running.get(row.array_name, 0) + count >= row.array_limit:
                continue
            offered[row.array_name] = count + 1
        kept.append(row)
    return kept


def _placements(
    rows: Iterable[Row[*tuple[Any, ...]]],
) -> tuple[dict[int, list[Placement]], dict[int, float]]:
    """Each workload's placements (the rows of a `_Reads.placements`), and when the first
    of them was made."""
    placed: dict[int, list[Placement]] = {}
    started: dict[int, float] = {}
    for workload_id, task, node, devices, gpu, created_at in rows:
        placed.setdefault(workload_id, []).append(Placement(task, node, tuple(devices), gpu))
        started[workload_id] = min(started.get(workload_id, created_at), created_at)
    return placed, started


def apply(session: Session, decisions: Decisions) -> list[Release]:
    """Write one cycle's decisions: evictions, bindings, reasons. Returns the evicted
    tasks, whose processes must now be stopped."""
    now = time.time()
    released = _apply_evictions(session, decisions)
    names = set(decisions.bindings) | set(decisions.pending)
    # Plain rows and statements run once for many rows: a burst of submissions binds
    # hundreds of workloads in one cycle.
    found = {row.name: row for row in read_in(session.connection(), _FOUND, "names", names)}
    if decisions.bindings:
        _bind(session, decisions, found, now)
    reasons = [
        {"workload_id": row.id, "reason": reason}
        for name, reason in decisions.pending.items()
        if (row := found.get(name)) is not None and row.status == "pending" and row.reason != reason
    ]
    if reasons:
        session.connection().execute(_REASON, reasons)
    return released


def _bind(
    session: Session, decisions: Decisions, rows: dict[str, Row[*tuple[Any, ...]]], now: float
) -> None:
    """Place the bound tasks (`rows`: workload name -> its `_FOUND` row)."""
    connection = session.connection()
    used = {p.node for placements in decisions.bindings.values() for p in placements}
    node_ids = dict(read_in(connection, _NODE_IDS, "names", used))
    # The evictions' deletes first: a device they free may be bound again here.
    session.flush()
    insert_placements(
        connection,
        [
            (
                rows[name].id,
                placement.task,
                node_ids[placement.node],
                list(placement.devices),
                placement.gpu,
                now,
                rows[name].launches + 1,
            )
            for name, placements in decisions.bindings.items()
            for placement in placements
        ],
        {
            row.id: (row.name, row.user, row.priority, row.queue_id)
            for row in map(rows.__getitem__, decisions.bindings)
        },
        {node_id: name for name, node_id in node_ids.items()},
    )
    for ids in each_chunk(connection, (rows[name].id for name in decisions.bindings)):
        connection.execute(_BOUND, {"ids": ids, "now": now})
    add_events(
        session,
        [
            event_values(
                now,
                "bound",
                "scheduler",
                f"{len(placements)} {'task' if len(placements) == 1 else 'tasks'} "
                f"on {', '.join(sorted({p.node for p in placements}))}",
                (name, rows[name].id),
                attempt=_attempt_bound(rows[name]),
            )
            for name, placements in decisions.bindings.items()
        ],
    )


def _attempt_bound(row: Row[*tuple[Any, ...]]) -> int:
    """The attempt a binding of the workload (its `_FOUND` row, read before `_BOUND`)
    belongs to: a new one, unless it runs already (an elastic workload that grows)."""
    attempts: int = row.attempts
    return attempts if row.status == "running" else attempts + 1


def _apply_evictions(session: Session, decisions: Decisions) -> list[Release]:
    if not decisions.evictions:
        return []
    rows = {
        row.name: row
        for names in chunks({e.workload for e in decisions.evictions})
        for row in session.scalars(
            select(WorkloadRow)
            .where(WorkloadRow.name.in_(names))
            .options(selectinload(WorkloadRow.placements))
        ).all()
    }
    released = []
    now = time.time()
    # Per workload, the GPU-seconds of work its evicted tasks had done since the last
    # checkpoint (or their start), and since when: recorded when it stops running.
    lost: dict[str, tuple[float, float]] = {}
    for eviction in decisions.evictions:
        row = rows[eviction.workload]
        gone = set(eviction.tasks)
        why = f"preempted: {eviction.action} for {eviction.by}: {eviction.reason}"
        released.extend(releases(row, gone, why))
        work, since = lost.get(row.name, (0.0, math.inf))
        for placement in row.placements:
            if placement.task in gone:
                begun = _unsaved_since(placement.created_at, row.checkpoint_at)
                work += placement.gpu * max(now - begun, 0.0)
                since = min(since, begun)
        lost[row.name] = (work, since)
        # The run it ends (or that goes on smaller, for an elastic workload that shrinks).
        attempt = row.attempts
        row.placements[:] = [p for p in row.placements if p.task not in gone]
        detail = why
        if not row.placements:
            row.status = "pending"
            row.pending_since = now
            row.reason = why
            # An elastic workload that only shrank keeps its work; one that stops loses
            # what it did since its last checkpoint.
            _record_lost(row, now, *lost[row.name])
            detail = f"{why}; {lost_phrase(row)}"
        add_workload_event(session, row, "preempted", eviction.action, detail, attempt=attempt)
    # Written before the bindings, which may give the same workload new placements.
    session.flush()
    return released


def _unsaved_since(bound: float, checkpoint: float | None) -> float:
    """From when a task's work is not saved: its last checkpoint, unless it was bound later."""
    return bound if checkpoint is None else max(bound, checkpoint)


def _record_lost(row: WorkloadRow, now: float, gpu_seconds: float, since: float) -> None:
    row.preempted_at = now
    row.lost_gpu_seconds = gpu_seconds
    row.lost_since = since if math.isfinite(since) else now
    row.lost_since_checkpoint = row.checkpoint_at is not None and row.checkpoint_at >= since


def lost_phrase(row: WorkloadRow) -> str:
    """What the row's latest preemption lost, in the words `corral describe` uses."""
    assert row.preempted_at is not None and row.lost_since is not None
    return lost_work_phrase(
        row.lost_gpu_seconds or 0.0,
        row.preempted_at - row.lost_since,
        bool(row.lost_since_checkpoint),
    )
