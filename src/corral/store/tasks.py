"""Tasks on nodes: what agents run, their processes starting and ending, and releases."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from corral.store.convert import workload_record
from corral.store.events import add_event
from corral.store.records import BoundWork, Release, TaskState
from corral.store.schema import NodeRow, PlacementRow, WorkloadRow


def bound_work(session: Session, node: str | None, names: set[str] | None) -> list[BoundWork]:
    """Running workloads with their bound tasks: those with a task on `node`, or those
    named, or all."""
    query = (
        select(WorkloadRow)
        .where(WorkloadRow.status == "running")
        .options(
            selectinload(WorkloadRow.task_groups),
            selectinload(WorkloadRow.placements)
            .selectinload(PlacementRow.node)
            .selectinload(NodeRow.devices),
        )
        .order_by(WorkloadRow.id)
    )
    if names is not None:
        query = query.where(WorkloadRow.name.in_(names))
    work = []
    for row in session.scalars(query).all():
        if node is not None and not any(p.node.name == node for p in row.placements):
            continue
        tasks = tuple(
            TaskState(
                task=p.task,
                node=p.node.name,
                address=p.node.address,
                devices=tuple(p.devices),
                gpu=p.gpu,
                device_memory=p.node.gpu_memory,
                state=p.state,
                pid=p.pid,
                proc_start=p.proc_start,
            )
            for p in row.placements
        )
        work.append(BoundWork(workload_record(row, row.queue.name), tasks))
    return work


def task_started(session: Session, workload: str, task: int, pid: int, proc_start: int) -> bool:
    """Record a task's process; False when the task is no longer bound (stop it)."""
    placement = _placement(session, workload, task)
    if placement is None:
        return False
    placement.state = "running"
    placement.pid = pid
    placement.proc_start = proc_start
    add_event(
        session,
        "task-started",
        "agent",
        f"task {task} pid {pid}",
        workload=workload,
        node=placement.node.name,
    )
    return True


def task_ended(
    session: Session,
    workload: str,
    task: int,
    exit_code: int | None,
    reason: str,
    attempt: int | None = None,
) -> list[Release]:
    """A task's process ended (see `Store.task_ended`). Returns the sibling tasks to stop."""
    placement = _placement(session, workload, task)
    row = session.scalar(select(WorkloadRow).where(WorkloadRow.name == workload))
    if placement is None or row is None:
        return []
    if attempt is not None and attempt != row.attempts:
        # An earlier attempt's process (preempted, then the workload bound again before
        # its end was reported): the task bound now has not ended.
        return []
    if exit_code == 0:
        _task_succeeded(session, row, placement, reason)
        return []
    node = placement.node.name
    why = f"task {task} on {node} {reason}"
    stopped = releases(
        row,
        {p.task for p in row.placements if p.task != task and p.state != "exited"},
        f"stopped: {why}",
    )
    row.placements.clear()
    row.failures += 1
    if row.failures <= row.backoff_limit:
        row.status = "pending"
        row.pending_since = time.time()
        row.reason = f"retrying ({row.failures} of {row.backoff_limit}): {why}"
        add_event(session, "retrying", "agent", why, workload=workload, node=node)
    else:
        row.status = "failed"
        row.reason = why
        row.finished_at = time.time()
        add_event(session, "failed", "agent", why, workload=workload, node=node)
    return stopped


def _task_succeeded(
    session: Session, row: WorkloadRow, placement: PlacementRow, reason: str
) -> None:
    # The workload succeeds once every placed task exited with 0 and enough were placed.
    placement.state = "exited"
    placement.exit_code = 0
    add_event(
        session,
        "task-exited",
        "agent",
        f"task {placement.task}: {reason}",
        workload=row.name,
        node=placement.node.name,
    )
    total = sum(group.replicas for group in row.task_groups)
    done = [p for p in row.placements if p.state == "exited"]
    if len(done) == len(row.placements) and len(row.placements) >= min(
        total, row.min_available or total
    ):
        row.placements.clear()
        row.status = "succeeded"
        row.reason = None
        row.finished_at = time.time()
        add_event(session, "succeeded", "agent", "every task exited with code 0", workload=row.name)


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


def _placement(session: Session, workload: str, task: int) -> PlacementRow | None:
    return session.scalar(
        select(PlacementRow)
        .join(WorkloadRow, PlacementRow.workload_id == WorkloadRow.id)
        .where(WorkloadRow.name == workload, PlacementRow.task == task)
    )
