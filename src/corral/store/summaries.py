"""Counts over the whole cluster, and the check of the store's invariants."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from corral.store.records import STATUSES, ClusterCounts
from corral.store.schema import DeviceRow, NodeRow, PlacementRow, QueueRow, WorkloadRow


def counts(session: Session) -> ClusterCounts:
    """Nodes, GPUs, allocation, workloads by status and queues, without loading rows."""
    nodes = session.execute(
        select(
            func.count(),
            func.count().filter(NodeRow.state == "ready"),
        ).select_from(NodeRow)
    ).one()
    devices = session.execute(
        select(func.count(), func.count().filter(DeviceRow.virtual)).select_from(DeviceRow)
    ).one()
    statuses = dict.fromkeys(STATUSES, 0)
    statuses.update(
        session.execute(select(WorkloadRow.status, func.count()).group_by(WorkloadRow.status)).all()
    )
    return ClusterCounts(
        nodes=nodes[0],
        nodes_ready=nodes[1],
        gpus=devices[0],
        virtual_gpus=devices[1],
        gpus_allocated=session.scalar(select(func.coalesce(func.sum(PlacementRow.gpu), 0.0)))
        or 0.0,
        workloads=statuses,
        queues=session.scalar(select(func.count()).select_from(QueueRow)) or 0,
    )


def integrity_problems(session: Session) -> list[str]:
    """Everything that contradicts the store's invariants (empty when it is sound)."""
    problems = []
    nodes = {row.id: row for row in session.scalars(select(NodeRow)).all()}
    usage: dict[tuple[int, int], float] = {}
    for placement in session.scalars(select(PlacementRow)).all():
        node = nodes.get(placement.node_id)
        workload = placement.workload
        if workload.status != "running":
            problems.append(f"{workload.name} is {workload.status} but holds a placement")
        if node is None:
            problems.append(f"{workload.name} is placed on a missing node")
            continue
        indices = {device.index for device in node.devices}
        for device in placement.devices:
            if device not in indices:
                problems.append(
                    f"{workload.name} uses {node.name} device {device}, which does not exist"
                )
            share = placement.gpu / len(placement.devices)
            usage[(node.id, device)] = usage.get((node.id, device), 0.0) + share
    for (node_id, device), used in sorted(usage.items()):
        if used > 1.0 + 1e-6:
            problems.append(f"{nodes[node_id].name} device {device} is committed {used:.2f} times")
    running = session.scalars(select(WorkloadRow).where(WorkloadRow.status == "running")).all()
    for workload in running:
        if not workload.placements:
            problems.append(f"{workload.name} is running without placements")
    return problems
