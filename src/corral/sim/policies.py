"""The policies a simulation compares, by name.

- `corral`: the engine as the cluster configures it: guaranteed quotas, over-quota
  borrowing, reclaim and preemption.
- `static`: every queue's limit is set to its deserved quota, so each project owns a
  fixed number of GPUs and nothing is lent; the cycle only allocates, first come first
  served within each project (higher priority first). Projects share nodes, so their
  partitions are not fragmented by node boundaries: a charitable "before".
- `fifo`: one pool without quotas, first come first served: every job goes to one queue
  at one priority, so the engine serves them by age; the cycle only allocates (with
  backfill: a job that does not fit does not hold back smaller ones behind it).
- `random`, `bestfit`, `packing`, `dotprod`: the fifo pool with the nodes chosen by that
  placement scorer (corral.sim.packing) instead of the engine's placement.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from corral.engine import Scheduler
from corral.model import (
    PRIORITY_CLASSES,
    Decisions,
    Node,
    Queue,
    Resources,
    SchedulerConfig,
    Snapshot,
    gpu_quota,
)
from corral.sim.cluster import Cluster
from corral.sim.errors import SimError
from corral.sim.names import POLICIES
from corral.sim.packing import SCORERS, ScorerScheduler

Schedule = Callable[[Snapshot, SchedulerConfig], Decisions]

POOL = "pool"
# fifo serves by age alone: every workload gets this one priority.
POOL_PRIORITY = PRIORITY_CLASSES["train"]


@dataclass(frozen=True, slots=True)
class Setup:
    """What one policy runs with. `pool` set: every job goes to that queue at
    `POOL_PRIORITY`; otherwise each job goes to its project's queue at its own priority."""

    policy: str
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    config: SchedulerConfig
    scheduler: Schedule
    pool: str | None = None


def prepare(policy: str, cluster: Cluster, seed: int = 0) -> Setup:
    """The setup of `policy` on `cluster`; `seed` drives the random scorer."""
    if policy == "corral":
        return Setup(policy, cluster.nodes, cluster.queues, cluster.config, Scheduler())
    config = replace(cluster.config, actions=("allocate",))
    if policy == "static":
        queues = tuple(_owned(queue) for queue in cluster.queues)
        return Setup(policy, cluster.nodes, queues, config, Scheduler())
    # Non-preemptible work must fit its queue's deserved quota: the pool deserves it all.
    pool = (Queue(POOL, deserved=gpu_quota(cluster.gpus)),)
    if policy == "fifo":
        return Setup(policy, cluster.nodes, pool, config, Scheduler(), POOL)
    if policy in SCORERS:
        scheduler = ScorerScheduler(SCORERS[policy], seed)
        return Setup(policy, cluster.nodes, pool, config, scheduler, POOL)
    raise SimError("--policy", f'unknown policy "{policy}" (policies: {", ".join(POLICIES)})')


def _owned(queue: Queue) -> Queue:
    """The queue with every managed resource limited to its deserved amount."""
    deserved = queue.deserved
    limit = Resources(
        *(
            deserved.get(name) if math.isfinite(deserved.get(name)) else queue.limit.get(name)
            for name in Resources.NAMES
        )
    )
    return replace(queue, limit=limit)
