"""`corral why` by node pool: while pools are in use, each pool is divided on its own, so
whether reclaim or preemption may help a workload is said for each pool it may run in, in
its order of preference, from the queues' quotas and shares in that pool and the work
running on that pool's nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.api.schemas.workloads import HolderOut, WhyOut
from corral.api.why_depth import deepen
from corral.engine.pools import queues_in
from corral.model import Decisions, Queue
from corral.model.spec import WorkloadSpec


def deepen_by_pool(
    why: WhyOut,
    spec: WorkloadSpec,
    queues: Sequence[Queue],
    last: Decisions | None,
    node_pools: Mapping[str, str],
) -> WhyOut:
    """`why_depth.deepen`, pool by pool when the latest cycle divided the cluster into
    pools (`node_pools`: each node's pool); as `deepen` otherwise."""
    if last is None or not last.pools:
        return deepen(why, spec, queues, last)
    whole = deepen(why, spec, queues, last)
    if why.status != "pending":
        return whole
    holders: list[HolderOut] = []
    reclaim: list[str] = []
    preempt: list[str] = []
    for pool in spec.node_pools or tuple(last.pools):
        statuses = last.pools.get(pool)
        if statuses is None:
            reclaim.append(f"pool {pool}: no node in pool {pool}")
            continue
        here = [holder for holder in why.holders if node_pools.get(holder.node) == pool]
        part = deepen(
            why.model_copy(update={"holders": here}),
            spec,
            queues_in(queues, pool),
            Decisions({}, (), {}, statuses),
        )
        holders.extend(part.holders)
        reclaim.append(f"pool {pool}: {part.reclaim}")
        preempt.append(f"pool {pool}: {part.preempt}")
    return whole.model_copy(
        update={
            "holders": holders,
            "reclaim": "; ".join(reclaim),
            "preempt": "; ".join(preempt) or whole.preempt,
        }
    )
