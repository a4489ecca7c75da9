"""Tasks on nodes: what agents run, their processes starting and ending, and releases."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import Row, Select, select
from sqlalchemy.orm import Session, selectinload

from corral.model import Placement, TaskGroup
from corral.store.convert import directory_of, spec_of
from corral.store.events import add_workload_event
from corral.store.records import BoundWork, Release, TaskState, WorkloadRecord
from corral.store.schema import NodeRow, PlacementRow, QueueRow, TaskGroupRow, WorkloadRow
from corral.store.workloads import TASK_GROUP_COLUMNS, WORKLOADS


def task_groups(session: Session, where: tuple[Any, ...]) -> dict[int, list[TaskGroup]]:
    """The task groups of the workloads that pass `where`, by workload id, in order."""
    return group_rows(session.connection().execute(task_groups_query(*where)).all())


def task_groups_query(*where: Any) -> Select[*tuple[Any, ...]]:
    """The select of the task groups of the workloads that pass `where`, for `group_rows`."""
    return (
        select(TaskGroupRow.workload_id, *TASK_GROUP_COLUMNS)
        .join(WorkloadRow, TaskGroupRow.workload_id == WorkloadRow.id)
        .where(*where)
        .order_by(TaskGroupRow.workload_id, TaskGroupRow.ordinal)
    )


def group_rows(rows: Iterable[Row[*tuple[Any, ...]]]) -> dict[int, list[TaskGroup]]:
    """The rows of `task_groups_query` as task groups, by workload id, in order."""
    groups: dict[int, list[TaskGroup]] = {}
    for workload_id, *group in rows:
        groups.setdefault(workload_id, []).append(TaskGroup(*group))
    return groups


def bound_work(
    session: Session, nodes: Collection[str] | None, names: Collection[str] | None
) -> list[BoundWork]:
    """Running workloads with their bound tasks: those with a task on one of `nodes`, or
    those named, or all."""
    # Plain rows of one select per table, not ORM object graphs: the reconciler reads
    # every running workload every pass (20,000 at 1,000 nodes).
    conditions: list[Any] = [WorkloadRow.status == "running"]
    if names is not None:
        conditions.append(WorkloadRow.name.in_(names))
    if nodes is not None:
        conditions.append(
            WorkloadRow.id.in_(
                select(PlacementRow.workload_id)
                .join(NodeRow, PlacementRow.node_id == NodeRow.id)
                .where(NodeRow.name.in_(nodes))
            )
        )
    rows = session.execute(
        select(WORKLOADS, QueueRow.name.label("project"))
        .join(QueueRow, WorkloadRow.queue_id == QueueRow.id)
        .where(*conditions)
        .order_by(WorkloadRow.id)
    ).all()
    if not rows:
        return []
    groups = task_groups(session, tuple(conditions))
    placed: dict[int, list[TaskState]] = {}
    for p in session.execute(
        select(
            PlacementRow.workload_id,
            PlacementRow.task,
            NodeRow.name,
            NodeRow.address,
            PlacementRow.devices,
            PlacementRow.gpu,
            NodeRow.gpu_memory,
            PlacementRow.state,
            PlacementRow.pid,
            PlacementRow.proc_start,
            PlacementRow.launch,
        )
        .join(NodeRow, PlacementRow.node_id == NodeRow.id)
        .join(WorkloadRow, PlacementRow.workload_id == WorkloadRow.id)
        .where(*conditions)
        .order_by(PlacementRow.workload_id, PlacementRow.task)
    ):
        placed.setdefault(p[0], []).append(
            TaskState(p[1], p[2], p[3], tuple(p[4]), p[5], p[6], p[7], p[8], p[9], p[10])
        )
    work = []
    for row in rows:
        tasks = tuple(placed.get(row.id, ()))
        record = WorkloadRecord(
            id=row.id,
            spec=spec_of(row, row.project, tuple(groups.get(row.id, ()))),
            status=row.status,
            reason=row.reason,
            attempts=row.attempts,
            dirs_by_name=row.dirs_by_name,
            created_at=row.created_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            placements=tuple(Placement(t.task, t.node, t.devices, t.gpu) for t in tasks),
        )
        work.append(BoundWork(record, tasks))
    return work


def bound_rows(session: Session, names: Collection[str]) -> dict[str, WorkloadRow]:
    """The rows of the named workloads, by name, with their placements (and their nodes)
    and task groups loaded: three selects however many workloads (a batch of reports)."""
    if not names:
        return {}
    rows = session.scalars(
        select(WorkloadRow)
        .where(WorkloadRow.name.in_(names))
        .options(
            selectinload(WorkloadRow.task_groups),
            selectinload(WorkloadRow.placements).selectinload(PlacementRow.node),
        )
    ).all()
    return {row.name: row for row in rows}


def placement_in(row: WorkloadRow | None, task: int) -> PlacementRow | None:
    """The placement of the task of `row`, or None when it is not bound."""
    if row is None:
        return None
    return next((p for p in row.placements if p.task == task), None)


def task_preparing(session: Session, workload: str, task: int, node: str, what: str) -> bool:
    """Note what the agent of `node` prepares before the task starts (its code, its
    environment, its image): on the placement, and as the workload's reason while none of
    its tasks runs. False when the task is not bound there waiting to start."""
    row = bound_rows(session, (workload,)).get(workload)
    placement = placement_in(row, task)
    if row is None or placement is None or placement.state != "bound":
        return False
    if placement.node.name != node:
        return False
    previous = placement.preparing
    placement.preparing = what
    if row.reason is None or row.reason == previous:
        row.reason = what
    return True


def task_started(
    session: Session,
    workload: str,
    task: int,
    pid: int,
    proc_start: int,
    rows: Mapping[str, WorkloadRow] | None = None,
) -> bool:
    """Record a task's process; False when the task is no longer bound (stop it).
    `rows`: the workload's row as `bound_rows` gives it, when the caller read it."""
    rows = bound_rows(session, (workload,)) if rows is None else rows
    row = rows.get(workload)
    placement = placement_in(row, task)
    if placement is None or row is None:
        return False
    placement.state = "running"
    placement.pid = pid
    placement.proc_start = proc_start
    if placement.preparing is not None:
        if row.reason == placement.preparing:
            row.reason = None
        placement.preparing = None
    add_workload_event(
        session,
        row,
        "task-started",
        "agent",
        f"task {task} pid {pid}",
        node=placement.node.name,
        attempt=row.attempts,
    )
    return True


def task_ended(
    session: Session,
    workload: str,
    task: int,
    exit_code: int | None,
    reason: str,
    attempt: int | None = None,
    launch: int | None = None,
    rows: Mapping[str, WorkloadRow] | None = None,
    cause: str | None = None,
    directory: str | None = None,
) -> list[Release]:
    """A task's process ended (see `Store.task_ended`). Returns the sibling tasks to stop.
    `rows` as for `task_started`; `cause` and `directory` as the agent reported them
    (corral.messages)."""
    rows = bound_rows(session, (workload,)) if rows is None else rows
    row = rows.get(workload)
    placement = placement_in(row, task)
    if placement is None or row is None:
        return []
    if directory is not None and directory != directory_of(row):
        # A task of a deleted workload whose name this one took: not this one's end.
        return []
    if attempt is not None and attempt != row.attempts:
        # An earlier attempt's process (preempted, then the workload bound again before
        # its end was reported): the task bound now has not ended.
        return []
    if launch is not None and placement.launch is not None and launch != placement.launch:
        # An earlier binding of this task within the same attempt (an elastic workload's
        # task evicted, then bound again as the workload grew): not this binding's end.
        return []
    node = placement.node.name
    why = f"task {task} on {node} {reason}"
    if cause is not None:
        # Corral ended it (its node was cut off, or an order of the server's): never the
        # workload's failure, whatever its exit code.
        return requeue(session, row, why, node, "agent", ended=task)
    if exit_code == 0:
        _task_succeeded(session, row, placement, reason)
        if row.failing_since is None:
            return []
    else:
        placement.state = "exited"
        placement.exit_code = exit_code
        if row.failing_since is None:
            row.failing_since = time.time()
            row.failing_reason = why
        elif len(row.failing_reason or "") < 2000:
            row.failing_reason = f"{row.failing_reason}; {why}"
    # The reporting node has just been heard from.
    waiting = [n for n in unheard_nodes(row, row.failing_since) if n != node]
    if not waiting:
        return fail(session, row)
    row.reason = (
        f"{row.failing_reason}; whether the workload failed waits for node"
        f" {', '.join(waiting)} (a lost node's gang is requeued, not failed)"
    )
    if exit_code != 0:
        add_workload_event(
            session,
            row,
            "task-exited",
            "agent",
            f"{why}; the verdict waits for {', '.join(waiting)}",
            node=node,
            attempt=row.attempts,
        )
    return []


# A node counts as heard from after a task's end when its heartbeat is this much newer:
# a heartbeat is written when a batch of reports is, after the agent's answer it stands for.
HEARD_MARGIN = 1.0


def unheard_nodes(row: WorkloadRow, since: float) -> list[str]:
    """The nodes of the workload's running tasks whose agent has not been heard from since
    `since` (a task's end): while one is late, a failing gang may be the victim of a lost
    node rather than the cause of its own failure."""
    nodes = {p.node.name: p.node for p in row.placements if p.state != "exited"}
    return sorted(
        name
        for name, node in nodes.items()
        if node.state != "ready" or (node.heartbeat_at or 0.0) < since + HEARD_MARGIN
    )


def fail(session: Session, row: WorkloadRow) -> list[Release]:
    """The workload's own failure (`failing_reason`): its other tasks stop, and it goes back
    to pending while it has retries left (`backoff_limit`), else it has failed. Returns
    the tasks to stop."""
    why = row.failing_reason or "a task failed"
    exited = [p for p in row.placements if p.state == "exited" and p.exit_code not in (0, None)]
    node = exited[0].node.name if exited else None
    code = exited[0].exit_code if exited else None
    stopped = releases(
        row, {p.task for p in row.placements if p.state != "exited"}, f"stopped: {why}"
    )
    row.placements.clear()
    row.failing_since = None
    row.failing_reason = None
    row.failures += 1
    row.exit_code = code
    if row.failures <= row.backoff_limit:
        row.status = "pending"
        row.pending_since = time.time()
        row.reason = f"retrying ({row.failures} of {row.backoff_limit}): {why}"
        add_workload_event(session, row, "retrying", "agent", why, node, row.attempts)
    else:
        row.status = "failed"
        row.reason = why
        row.finished_at = time.time()
        add_workload_event(session, row, "failed", "agent", why, node, row.attempts)
    return stopped


def requeue(
    session: Session, row: WorkloadRow, why: str, node: str, cause: str, ended: int = -1
) -> list[Release]:
    """Send a workload back to pending as a whole, as after a preemption: its end was not
    its own doing (a lost or fenced node), so no retry is used. Returns its tasks that
    still run (but task `ended`), to stop."""
    running = {p.task for p in row.placements if p.state != "exited" and p.task != ended}
    stopped = releases(row, running, f"requeued: {why}")
    row.placements.clear()
    row.failing_since = None
    row.failing_reason = None
    row.status = "pending"
    row.pending_since = time.time()
    row.reason = f"requeued: {why}"
    add_workload_event(session, row, "requeued", cause, why, node, row.attempts)
    return stopped


def settle_failing(session: Session, timeout: float) -> tuple[list[Release], set[str]]:
    """Decide the workloads whose verdict waits (see `task_ended`): failed once every node
    of their running tasks has been heard from since, or after `timeout` (the loss
    timeout: a node not heard from for that long is declared lost, and its workloads were
    requeued already). Returns the tasks to stop and the workloads decided."""
    now = time.time()
    rows = session.scalars(
        select(WorkloadRow)
        .where(WorkloadRow.failing_since.is_not(None), WorkloadRow.status == "running")
        .options(selectinload(WorkloadRow.placements).selectinload(PlacementRow.node))
    ).all()
    stopped: list[Release] = []
    decided: set[str] = set()
    for row in rows:
        since = row.failing_since or now
        if now - since < timeout and unheard_nodes(row, since):
            continue
        stopped.extend(fail(session, row))
        decided.add(row.name)
    return stopped, decided


def _task_succeeded(
    session: Session, row: WorkloadRow, placement: PlacementRow, reason: str
) -> None:
    # The workload succeeds once every placed task exited with 0 and enough were placed.
    placement.state = "exited"
    placement.exit_code = 0
    add_workload_event(
        session,
        row,
        "task-exited",
        "agent",
        f"task {placement.task}: {reason}",
        node=placement.node.name,
        attempt=row.attempts,
    )
    total = sum(group.replicas for group in row.task_groups)
    done = [p for p in row.placements if p.state == "exited" and p.exit_code == 0]
    if len(done) == len(row.placements) and len(row.placements) >= min(
        total, row.min_available or total
    ):
        row.placements.clear()
        row.status = "succeeded"
        row.reason = None
        row.exit_code = 0
        row.finished_at = time.time()
        add_workload_event(
            session, row, "succeeded", "agent", "every task exited with code 0", None, row.attempts
        )


def releases(row: WorkloadRow, tasks: set[int], reason: str) -> list[Release]:
    """The tasks of `row` among `tasks`, grouped by node."""
    by_node: dict[str, list[int]] = {}
    for placement in row.placements:
        if placement.task in tasks:
            by_node.setdefault(placement.node.name, []).append(placement.task)
    return [
        Release(row.name, node, tuple(sorted(numbers)), reason)
        for node, numbers in sorted(by_node.items())
    ]


def stamped(releases: list[Release], decided_at: float) -> list[Release]:
    """`releases` marked as decided at `decided_at`: the time the transaction that
    released them began, before it read anything (see corral.messages)."""
    return [replace(release, decided_at=decided_at) for release in releases]
