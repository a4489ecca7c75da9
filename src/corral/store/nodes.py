"""Nodes: registration with their devices, cordoning, heartbeats and expiry."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import cast

from sqlalchemy import Table, select, update
from sqlalchemy.orm import Session

from corral.model.spec import Device, NodeSpec
from corral.store.convert import node_of, node_placements, node_record
from corral.store.errors import Conflict, Invalid, NotFound
from corral.store.events import add_event, add_events, event_values
from corral.store.records import NodeRecord, NodeState, Release, TaskOnNode
from corral.store.schema import DeviceRow, NodeRow, PlacementRow, QueueRow, WorkloadRow
from corral.store.tasks import requeue

NODES = cast(Table, NodeRow.__table__)


def node_row(session: Session, name: str) -> NodeRow:
    """The node's row; NotFound when there is none."""
    row = session.scalar(select(NodeRow).where(NodeRow.name == name))
    if row is None:
        raise NotFound(f"node {name!r} not found")
    return row


def check_devices(spec: NodeSpec) -> None:
    """A node lists each of its GPUs once, indexed 0 to gpus-1."""
    node = spec.node
    if len(spec.devices) != node.gpus:
        raise Invalid("devices", f"{len(spec.devices)} devices listed for {node.gpus} GPUs")
    if sorted(device.index for device in spec.devices) != list(range(node.gpus)):
        raise Invalid("devices", "device indices must be 0 to gpus-1, each once")


def register_node(session: Session, spec: NodeSpec, replace_existing: bool) -> NodeRecord:
    """Add a node with its devices, or with `replace_existing` update an existing node's
    devices and labels and keep its work (see `Store.register_node`)."""
    node = spec.node
    row = session.scalar(select(NodeRow).where(NodeRow.name == node.name))
    now = time.time()
    if row is not None and not replace_existing:
        raise Conflict(f"node {node.name!r} already exists")
    if row is None:
        row = NodeRow(name=node.name, registered_at=now, schedulable=True)
        session.add(row)
    else:
        used = max(
            (max(p.devices, default=-1) for p in node_placements(session, row)),
            default=-1,
        )
        if used >= node.gpus:
            raise Conflict(f"node {node.name!r} has work on device {used}")
        row.devices.clear()
        session.flush()
    row.gpu_model = node.gpu_model
    row.gpu_memory = node.gpu_memory
    row.cpu = node.cpu
    row.memory = node.memory
    row.labels = dict(node.labels)
    row.virtual = spec.virtual
    if spec.address is not None:
        row.address = spec.address
    row.state = "ready"
    row.heartbeat_at = now
    row.devices = [
        DeviceRow(index=d.index, uuid=d.uuid, model=d.model, memory=d.memory, virtual=d.virtual)
        for d in sorted(spec.devices, key=lambda d: d.index)
    ]
    session.flush()
    add_event(session, "node-registered", "api", f"{node.gpus} GPUs", node=node.name)
    return node_record(session, row)


def set_schedulable(session: Session, name: str, schedulable: bool) -> NodeRecord:
    """Cordon or uncordon a node."""
    row = node_row(session, name)
    if row.schedulable != schedulable:
        row.schedulable = schedulable
        kind = "node-uncordoned" if schedulable else "node-cordoned"
        add_event(session, kind, "api", "", node=name)
    return node_record(session, row)


def remove_node(session: Session, name: str) -> list[str]:
    """Remove a node; its workloads go back to pending. Returns their names."""
    row = node_row(session, name)
    requeued, _ = requeue_node(session, row, f"node {name} was removed")
    session.delete(row)
    add_event(session, "node-removed", "api", "", node=name)
    return requeued


def list_nodes(session: Session) -> list[NodeRecord]:
    """Every node, by name."""
    # One select per table for all nodes, plain rows: a query per node (its placements)
    # cost seconds at 1,000 nodes, and the monitor reads every node every pass.
    devices: dict[int, list[Device]] = {}
    for d in session.execute(
        select(
            DeviceRow.node_id,
            DeviceRow.index,
            DeviceRow.uuid,
            DeviceRow.model,
            DeviceRow.memory,
            DeviceRow.virtual,
        ).order_by(DeviceRow.node_id, DeviceRow.index)
    ):
        devices.setdefault(d[0], []).append(Device(*d[1:]))
    tasks: dict[int, list[TaskOnNode]] = {}
    for p in session.execute(
        select(
            PlacementRow.node_id,
            WorkloadRow.name,
            QueueRow.name,
            PlacementRow.task,
            PlacementRow.devices,
            PlacementRow.gpu,
        )
        .join(WorkloadRow, PlacementRow.workload_id == WorkloadRow.id)
        .join(QueueRow, WorkloadRow.queue_id == QueueRow.id)
    ):
        tasks.setdefault(p[0], []).append(TaskOnNode(p[1], p[2], p[3], tuple(p[4]), p[5]))
    records = []
    for row in session.execute(select(NODES).order_by(NodeRow.name)):
        listed = tuple(devices.get(row.id, ()))
        node = node_of(row, len(listed))
        on_node = sorted(tasks.get(row.id, ()), key=lambda t: (t.devices, t.workload, t.task))
        records.append(
            NodeRecord(
                node=node,
                devices=listed,
                virtual=row.virtual,
                state=row.state,
                registered_at=row.registered_at,
                heartbeat_at=row.heartbeat_at,
                tasks=tuple(on_node),
                address=row.address,
            )
        )
    return records


def node_states(session: Session) -> list[NodeState]:
    """Every node's name, state and last heartbeat, by name."""
    return [
        NodeState(*row)
        for row in session.execute(
            select(NodeRow.name, NodeRow.state, NodeRow.heartbeat_at).order_by(NodeRow.name)
        )
    ]


def heartbeat(session: Session, node: str) -> bool:
    """The node's agent is alive; True when the node was unavailable and is ready again."""
    row = session.scalar(select(NodeRow).where(NodeRow.name == node))
    if row is None:
        return False
    row.heartbeat_at = time.time()
    if row.state == "ready":
        return False
    row.state = "ready"
    add_event(session, "node-ready", "agent", "heartbeat resumed", node=node)
    return True


def heartbeats(session: Session, names: Collection[str]) -> bool:
    """Every named node's agent is alive (as `heartbeat` each, in two statements); True
    when one of them was unavailable and is ready again."""
    now = time.time()
    revived = session.scalars(
        select(NodeRow.name)
        .where(NodeRow.name.in_(names), NodeRow.state != "ready")
        .order_by(NodeRow.name)
    ).all()
    session.connection().execute(
        update(NODES).where(NODES.c.name.in_(names)).values(heartbeat_at=now)
    )
    if revived:
        session.connection().execute(
            update(NODES).where(NODES.c.name.in_(revived)).values(state="ready")
        )
        add_events(
            session,
            [
                event_values(now, "node-ready", "agent", "heartbeat resumed", node=n)
                for n in revived
            ],
        )
    return bool(revived)


def expire_nodes(
    session: Session, silent: Mapping[str, float], limit: float
) -> tuple[dict[str, list[str]], list[Release]]:
    """Declare lost the nodes of `silent` (name -> seconds since their agent last answered)
    that are ready and have no heartbeat since `limit`, and requeue their workloads, each
    gang as a whole. Returns the workloads requeued by each node declared lost, and the
    tasks they still had running on other nodes (to stop)."""
    rows = session.scalars(
        select(NodeRow)
        .where(
            NodeRow.name.in_(sorted(silent)),
            NodeRow.state == "ready",
            NodeRow.heartbeat_at < limit,
        )
        .order_by(NodeRow.name)
    ).all()
    stopped: list[Release] = []
    lost: dict[str, list[str]] = {}
    for row in rows:
        row.state = "unavailable"
        quiet = f"no answer for {silent[row.name]:.0f} s"
        add_event(session, "node-unavailable", "monitor", quiet, node=row.name)
        lost[row.name], releases = requeue_node(session, row, f"node {row.name} was lost ({quiet})")
        stopped.extend(r for r in releases if r.node != row.name)
    return lost, stopped


def requeue_node(session: Session, row: NodeRow, why: str) -> tuple[list[str], list[Release]]:
    """Send every workload with a task on `row` back to pending, a gang as a whole, as
    after a preemption (no retry used). Returns their names and their tasks to stop."""
    # IN, not DISTINCT: PostgreSQL cannot compare the JSON columns DISTINCT would.
    affected = session.scalars(
        select(WorkloadRow)
        .where(
            WorkloadRow.id.in_(
                select(PlacementRow.workload_id).where(PlacementRow.node_id == row.id)
            )
        )
        .order_by(WorkloadRow.id)
    ).all()
    stopped: list[Release] = []
    for workload in affected:
        stopped.extend(requeue(session, workload, why, row.name, "node"))
    return [workload.name for workload in affected], stopped
