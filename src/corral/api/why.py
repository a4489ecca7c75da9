"""Why a workload waits (`corral why`): its reason, its place, who holds what it could use."""

from __future__ import annotations

from collections.abc import Collection

from corral.api.schemas.workloads import HolderOut, WhyOut
from corral.engine.state import natural_key
from corral.store import Store


def explain(store: Store, name: str, readable: Collection[str] | None = None) -> WhyOut:
    """Why a workload waits: the engine's reason, its place in its project, and who holds
    the GPUs it could use. A holder outside the `readable` projects (None: all) is shown
    by project, priority and size, but not by name."""
    record = store.get_workload(name)
    spec = record.spec
    position = None
    ahead: list[str] = []
    if record.status == "pending":
        pending = store.list_workloads(project=spec.project, status="pending")
        ordered = sorted(pending, key=lambda r: (-r.spec.priority, r.id))
        names = [r.name for r in ordered]
        position = names.index(name) + 1
        ahead = names[: position - 1]
    holders = []
    selector = spec.node_selector
    running = {r.name: r for r in store.list_workloads(status="running")}
    for node in sorted(store.list_nodes(), key=lambda n: natural_key(n.node.name)):
        if any(node.node.label(key) not in values for key, values in selector.items()):
            continue
        if spec.node_pools and node.node.pool not in spec.node_pools:
            continue
        for task in node.tasks:
            holder = running.get(task.workload)
            if holder is None or holder.name == name:
                continue
            holders.append(
                HolderOut(
                    workload=task.workload
                    if readable is None or task.project in readable
                    else None,
                    project=task.project,
                    priority=holder.spec.priority,
                    preemptible=holder.spec.preemptible,
                    node=node.node.name,
                    gpu=task.gpu,
                    may_take=None,
                )
            )
    return WhyOut(
        workload=name,
        status=record.status,
        reason=record.reason,
        position=position,
        ahead=ahead,
        holders=holders,
        needs=0.0,
        reclaim=None,
        preempt=None,
    )
