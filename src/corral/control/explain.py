"""What the running system says about its scheduling: why a workload waits (`corral why`,
in the engine's rules of `corral.engine.explain`, from the store and the last cycle's
decisions) and when pending work may start (`squeue --start`, by the engine's estimate).
The API turns these plain values into its bodies."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from corral.engine.estimate import estimate_start
from corral.engine.explain import (
    Holder,
    QueueOnPath,
    Why,
    deepen,
    deepen_by_pool,
    may_use,
    weight_reason,
)
from corral.engine.state import natural_key
from corral.model import Decisions
from corral.model.spec import short_name
from corral.store import Store, WorkloadRecord

__all__ = ["Holder", "QueueOnPath", "Start", "Why", "estimated_starts", "weight_reason", "why"]

# The most pending workloads one request estimates a start for (each costs a few cycles).
ESTIMATE_LIMIT = 100


def why(
    store: Store,
    record: WorkloadRecord,
    readable: Collection[str] | None,
    last: Decisions | None,
) -> Why:
    """Why the workload of `record` waits: the engine's reason, its place in its project,
    who holds the GPUs it could use, and (from the `last` cycle's decisions) its queues
    and what reclaim and preemption may do for it. A holder outside the `readable`
    projects (None: all) is shown by project, priority and size, but not by name."""
    name = record.name
    spec = record.spec
    position = None
    ahead: tuple[str, ...] = ()
    if record.status == "pending":
        pending = store.list_workloads(project=spec.project, status="pending")
        ordered = sorted(pending, key=lambda r: (-r.spec.priority, r.id))
        names = [r.name for r in ordered]
        position = names.index(name) + 1
        ahead = tuple(short_name(key) for key in names[: position - 1])
    holders = []
    running = {r.name: r for r in store.list_workloads(status="running")}
    nodes = sorted(store.list_nodes(), key=lambda n: natural_key(n.node.name))
    for node in nodes:
        if not may_use(node.node, spec):
            continue
        for task in node.tasks:
            holder = running.get(task.workload)
            if holder is None or holder.name == name:
                continue
            holders.append(
                Holder(
                    workload=short_name(task.workload)
                    if readable is None or task.project in readable
                    else None,
                    project=task.project,
                    priority=holder.spec.priority,
                    preemptible=holder.spec.preemptible,
                    node=node.node.name,
                    gpu=task.gpu,
                )
            )
    plain = Why(short_name(name), record.status, record.reason, position, ahead, tuple(holders))
    queues = [queue.queue for queue in store.list_queues()]
    if last is None or not last.pools:
        return deepen(plain, spec, queues, last)
    pools = {node.node.name: node.node.pool for node in store.list_nodes()}
    return deepen_by_pool(plain, spec, queues, last, pools)


@dataclass(frozen=True, slots=True)
class Start:
    """When a pending workload may start (seconds since the epoch; None when it cannot be
    known), and what the estimate rests on."""

    workload: str
    project: str
    estimated_start: float | None
    why: str


def estimated_starts(store: Store, pending: list[WorkloadRecord]) -> list[Start]:
    """An estimated start for each pending workload (the first ESTIMATE_LIMIT), from the
    engine: after which running workloads end, by their maximum runtime, it would fit."""
    now = time.time()
    snapshot = store.snapshot()
    offered = {w.name for w in snapshot.workloads if not w.placements}
    ends = {
        r.name: r.started_at + r.spec.max_runtime
        for r in store.list_workloads(status="running")
        if r.started_at is not None and r.spec.max_runtime is not None
    }
    answers = []
    for number, record in enumerate(pending):
        at: float | None = None
        if number >= ESTIMATE_LIMIT:
            said = f"not estimated: only the first {ESTIMATE_LIMIT} are"
        elif record.name not in offered:
            said = record.reason or "it waits for its dependencies or its array's limit"
        else:
            at = estimate_start(snapshot, record.name, ends, now)
            said = (
                "fits now"
                if at == now
                else "after running work ends (by its max runtime)"
                if at is not None
                else "unknown: it needs GPUs held by work with no max runtime"
            )
        answers.append(Start(short_name(record.name), record.spec.project, at, said))
    return answers
