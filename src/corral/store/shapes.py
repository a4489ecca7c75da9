"""The shape of the cluster: every node's size and labels, and the queue tree, without the
work on them. What a submission is checked against (corral.control.admission), read in two
queries however many workloads run."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from corral.model import Node, Queue
from corral.store.convert import node_of, queue_from_row
from corral.store.schema import DeviceRow, NodeRow, QueueRow


def cluster_shape(session: Session) -> tuple[tuple[Node, ...], tuple[Queue, ...]]:
    """Every node (cordoned and unavailable ones too: they may come back) as the engine
    sees its size, by name, and every queue."""
    devices = (
        select(DeviceRow.node_id, func.count(DeviceRow.id).label("gpus"))
        .group_by(DeviceRow.node_id)
        .subquery()
    )
    rows = session.execute(
        select(NodeRow, func.coalesce(devices.c.gpus, 0))
        .outerjoin(devices, devices.c.node_id == NodeRow.id)
        .order_by(NodeRow.name)
    ).all()
    nodes = tuple(node_of(row, int(gpus)) for row, gpus in rows)
    queue_rows = session.scalars(select(QueueRow)).all()
    names = {row.id: row.name for row in queue_rows}
    return nodes, tuple(queue_from_row(row, names) for row in queue_rows)
