"""Workspaces in the store: the port numbers agents report for a task's declared ports,
where the proxy finds a workload's task (its node's address and port), and when the proxy
last carried a workload's traffic (idle detection)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session, selectinload

from corral.model.spec import PortSpec
from corral.store.errors import NotFound
from corral.store.schema import PlacementRow, WorkloadRow


@dataclass(frozen=True, slots=True)
class Target:
    """Where one task of a workload runs, as the proxy and `exec` need it. `node`,
    `address` and `numbers` are empty when the task is not bound (or not started)."""

    workload: str
    project: str
    user: str
    status: str
    ports: tuple[PortSpec, ...]
    task: int
    node: str | None
    address: str | None
    state: str | None
    numbers: Mapping[str, int]
    active_at: float | None
    # The workload's id (its own origin is named by it: corral.workspaces.origins).
    id: int = 0


def task_ports(
    session: Session, workload: str, task: int, ports: Mapping[str, int], node: str | None = None
) -> bool:
    """Record the numbers an agent gave a task's ports; False when it is not bound (on
    `node`, when given: a report from a node the task has left is not about it)."""
    placement = session.scalars(
        select(PlacementRow)
        .join(WorkloadRow, PlacementRow.workload_id == WorkloadRow.id)
        .where(WorkloadRow.name == workload, PlacementRow.task == task)
    ).one_or_none()
    if placement is None or (node is not None and placement.node.name != node):
        return False
    placement.ports = {str(name): int(number) for name, number in ports.items()}
    return True


def target(session: Session, workload: str, task: int = 0) -> Target:
    """Where task `task` of `workload` runs; NotFound when there is no such workload."""
    row = session.scalars(
        select(WorkloadRow)
        .where(WorkloadRow.name == workload)
        .options(selectinload(WorkloadRow.placements).selectinload(PlacementRow.node))
    ).one_or_none()
    if row is None:
        raise NotFound(f"workload {workload!r} not found")
    placement = next((p for p in row.placements if p.task == task), None)
    ports = tuple(PortSpec(p["name"], bool(p.get("base_url"))) for p in row.ports or ())
    return Target(
        workload=row.name,
        project=row.queue.name,
        user=row.user,
        status=row.status,
        ports=ports,
        task=task,
        node=placement.node.name if placement else None,
        address=placement.node.address if placement else None,
        state=placement.state if placement else None,
        numbers=dict(placement.ports or {}) if placement else {},
        active_at=row.active_at,
        id=row.id,
    )


def key_of(session: Session, workload_id: int) -> str:
    """The key of the workload whose id is `workload_id`; NotFound."""
    key = session.scalar(select(WorkloadRow.name).where(WorkloadRow.id == workload_id))
    if key is None:
        raise NotFound(f"no workload of id {workload_id}")
    return key


def mark_active(session: Session, workloads: Collection[str], at: float) -> None:
    """The proxy carried traffic of these workloads at `at`."""
    if workloads:
        session.execute(
            update(WorkloadRow).where(WorkloadRow.name.in_(list(workloads))).values(active_at=at)
        )


def active_at(session: Session, workloads: Collection[str]) -> dict[str, float]:
    """When the proxy last carried traffic of each of these workloads (those it did)."""
    rows = session.execute(
        select(WorkloadRow.name, WorkloadRow.active_at).where(
            WorkloadRow.name.in_(list(workloads)), WorkloadRow.active_at.is_not(None)
        )
    ).all()
    return {name: float(at) for name, at in rows if at is not None}
