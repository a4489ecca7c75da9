"""The scheduling domain: nodes, queues, workloads, the snapshot the engine reads and the
decisions it returns."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from corral.model.resources import UNLIMITED, Resources

PRIORITY_CLASSES: Mapping[str, int] = {
    "train": 50,
    "build-preemptible": 75,
    "interactive-preemptible": 75,
    "build": 100,
    "interactive": 100,
    "inference": 125,
}
# A workload that names no priority is training work.
DEFAULT_PRIORITY = PRIORITY_CLASSES["train"]
# Seconds from SIGTERM to SIGKILL when a task is stopped, unless its workload says otherwise.
DEFAULT_GRACE_PERIOD = 30.0

# The workload classes that queue rules name, by their own names, and the other names
# they go by.
WORKLOAD_CLASSES = ("train", "build-preemptible", "build", "inference")
CLASS_ALIASES: Mapping[str, str] = {
    "interactive": "build",
    "interactive-preemptible": "build-preemptible",
}

# Workloads at or above this priority are non-preemptible unless they say otherwise.
NON_PREEMPTIBLE_PRIORITY = 100

# A node's pool is the value of this label; nodes without it are in DEFAULT_POOL.
POOL_LABEL = "pool"
DEFAULT_POOL = "default"


def resolve_priority(value: str | int) -> int:
    """Turn a priority class name or an integer into the integer priority."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a priority")
    if isinstance(value, int):
        return value
    if value in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[value]
    try:
        return int(value)
    except ValueError:
        names = ", ".join(PRIORITY_CLASSES)
        raise ValueError(f"{value!r} is not a priority class ({names}) or an integer") from None


def default_preemptible(priority: int) -> bool:
    """Work below the build/interactive priority is preemptible unless it says otherwise."""
    return priority < NON_PREEMPTIBLE_PRIORITY


@dataclass(frozen=True, slots=True)
class Node:
    """A machine with `gpus` identical devices, indexed 0..gpus-1."""

    name: str
    gpus: int = 0
    gpu_memory: int = 80 * 1024**3
    gpu_model: str = "generic"
    cpu: float = 64.0
    memory: int = 512 * 1024**3
    labels: Mapping[str, str] = field(default_factory=dict)
    schedulable: bool = True

    def label(self, key: str) -> str | None:
        """The node's value for a label; `gpu_model` is always answered from the model."""
        if key == "gpu_model":
            return self.gpu_model
        return self.labels.get(key)

    @property
    def pool(self) -> str:
        """The node pool the node belongs to: its `pool` label, else the default pool."""
        return self.labels.get(POOL_LABEL) or DEFAULT_POOL


@dataclass(frozen=True, slots=True)
class PoolQuota:
    """A queue's quota in one node pool (see Queue.pools)."""

    deserved: Resources = Resources(0.0, math.inf, math.inf)
    limit: Resources = UNLIMITED


@dataclass(frozen=True, slots=True)
class Queue:
    """A department or project. Leaf queues hold workloads.

    `limit` amounts are math.inf where there is no limit. `over_quota_weight` is per
    resource too, so that CPU-heavy and GPU-heavy teams can be weighted differently.
    CPU and memory are managed only where a quota is set: their `deserved` defaults to
    math.inf (no guarantee needed, nothing enforced), while GPUs default to 0 deserved.
    """

    name: str
    parent: str | None = None
    deserved: Resources = Resources(0.0, math.inf, math.inf)
    limit: Resources = UNLIMITED
    over_quota_weight: Resources = Resources(1.0, 1.0, 1.0)
    priority: int = 100
    # Seconds a workload must have run before it may be a victim of preemption (of
    # reclaim): None inherits the parent's, and a root's None is off.
    preempt_min_runtime: float | None = None
    reclaim_min_runtime: float | None = None
    # Time-decayed fair share: the half-life (seconds) of the queue's usage history, and
    # how strongly that history moves its over-quota weight. None inherits the parent's;
    # a root's None half-life is off, and a None factor is 1.
    fair_share_half_life: float | None = None
    fair_share_k: float | None = None

    # Quotas by node pool. `deserved` and `limit` above are the quota in the default pool
    # (the whole cluster while no pool is used); a named pool not listed here gives the
    # queue no deserved quota and no limit there.
    pools: Mapping[str, PoolQuota] = field(default_factory=dict)

    def quota_in(self, pool: str) -> PoolQuota:
        """The queue's deserved quota and limit in `pool`."""
        quota = self.pools.get(pool)
        if quota is not None:
            return quota
        if pool == DEFAULT_POOL:
            return PoolQuota(self.deserved, self.limit)
        return PoolQuota()

    # Seconds a workload waits at the head of this queue before it gets a reservation
    # (backfill): None inherits the parent's, and a root's None is off.
    reserve_after: float | None = None


@dataclass(frozen=True, slots=True)
class TaskGroup:
    """`replicas` identical tasks.

    `gpu` is a whole number of devices (>= 1), a fraction of one device (0 < gpu < 1), or 0.
    `gpu_memory` (bytes), when set, asks for that much of one device's memory instead of a
    fraction; the fraction is then gpu_memory / the device's memory on the node chosen.
    """

    name: str = "task"
    replicas: int = 1
    gpu: float = 0.0
    gpu_memory: int = 0
    cpu: float = 0.0
    memory: int = 0

    @property
    def fractional(self) -> bool:
        return self.gpu_memory > 0 or 0 < self.gpu < 1

    def gpu_on(self, node: Node) -> float:
        """GPUs this task takes on `node` (memory requests become a device fraction)."""
        if self.gpu_memory > 0:
            # Above 1.0 when the task wants more memory than one device has: it cannot fit.
            return self.gpu_memory / node.gpu_memory if node.gpu_memory else math.inf
        return self.gpu


def group_of(groups: tuple[TaskGroup, ...], task: int) -> TaskGroup:
    """The group of `groups` that task number `task` belongs to (tasks are numbered
    0..n-1 in task-group order); IndexError past the last."""
    for group in groups:
        if task < group.replicas:
            return group
        task -= group.replicas
    raise IndexError(task)


@dataclass(frozen=True, slots=True)
class Topology:
    """Keep a workload's tasks within one domain of a node label (for example a rack)."""

    key: str
    required: bool


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one task runs: its node, the device indices it uses, and the GPU amount.

    A fractional task lists the single device it shares and its fraction in `gpu`.
    """

    task: int
    node: str
    devices: tuple[int, ...] = ()
    gpu: float = 0.0


@dataclass(frozen=True, slots=True)
class Workload:
    """A unit of work submitted to a leaf queue: one or more task groups.

    Tasks are numbered 0..n-1 in task-group order. `min_available` tasks (the first ones)
    start together or not at all; the rest, if any, are elastic and added one at a time.
    `submitted` orders workloads by age (smaller is older). `placements` is empty for a
    pending workload and lists each running task otherwise.
    """

    name: str
    queue: str
    task_groups: tuple[TaskGroup, ...]
    priority: int = DEFAULT_PRIORITY
    preemptible: bool = True
    min_available: int | None = None
    node_selector: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    topology: Topology | None = None
    submitted: float = 0.0
    placements: tuple[Placement, ...] = ()
    # Utilisation hint for victim choice: True when the GPUs this workload holds are idle.
    idle: bool = False
    # Seconds since the workload last started (for min-runtime); None: unknown, old enough.
    running_for: float | None = None
    # Seconds since its last checkpoint (work lost if evicted now); None: unknown.
    since_checkpoint: float | None = None
    # Node pools it may run in, in order of preference; empty: any pool.
    node_pools: tuple[str, ...] = ()

    # Seconds a run may last at most (it is stopped then); None: no limit, end unknown.
    max_runtime: float | None = None
    # Seconds since a pending workload last became pending (for reservations); None:
    # unknown, just arrived.
    waiting_for: float | None = None

    @property
    def task_count(self) -> int:
        return sum(group.replicas for group in self.task_groups)

    @property
    def min_tasks(self) -> int:
        count = self.task_count
        if self.min_available is None:
            return count
        return max(1, min(self.min_available, count))

    @property
    def elastic(self) -> bool:
        # Asked for every workload in every cycle: most have no minimum, and need no sums.
        return self.min_available is not None and self.min_tasks < self.task_count

    def task_group_of(self, task: int) -> TaskGroup:
        """The task group that task number `task` belongs to."""
        return group_of(self.task_groups, task)

    def tasks(self) -> list[TaskGroup]:
        """One entry per task, in task order."""
        return [group for group in self.task_groups for _ in range(group.replicas)]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster at one moment: everything the engine needs and nothing else.

    `hidden` stands for pending workloads left out of the cycle (the simulator leaves out
    backlogs that cannot be placed): one workload of each kind, with how many there are.
    The engine does not try to place them; it only weighs their task shapes when it
    places the others (fragmentation-aware placement), so that leaving them out changes
    no decision."""

    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    workloads: tuple[Workload, ...]
    hidden: tuple[tuple[Workload, int], ...] = ()
    # Time-decayed fair share: each queue's share of the cluster's allocated GPU-time,
    # decayed with its half-life (0 to 1, see `model.usage`); a queue not listed used none.
    usage: Mapping[str, float] = field(default_factory=dict)


PlacementPolicy = Literal["binpack", "spread"]
GpuPlacementPolicy = Literal["pack", "spread"]
ACTIONS = ("allocate", "consolidate", "reclaim", "preempt")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """How a cycle behaves. Every field has a default."""

    placement: PlacementPolicy = "binpack"
    gpu_placement: GpuPlacementPolicy = "pack"
    actions: tuple[str, ...] = ACTIONS
    # Bounds on the search done for each pending workload, so one cycle stays fast.
    consolidate_max_moves: int = 4
    consolidate_max_nodes: int = 16


@dataclass(frozen=True, slots=True)
class Eviction:
    """Tasks taken off their devices. `tasks` lists the task numbers evicted; when it
    covers every running task the workload goes back to pending."""

    workload: str
    tasks: tuple[int, ...]
    action: str
    by: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class QueueStatus:
    deserved: Resources
    limit: Resources
    fair_share: Resources
    allocated: Resources
    requested: Resources
    # Time-decayed fair share, where it is on: the over-quota GPU weight the surplus was
    # divided by, and the usage share it was worked out from.
    weight: float | None = None
    usage: float | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """Nodes held for a pending workload that has waited long at the head of its queue:
    no new work goes there unless its max runtime ends before `starts_in` (seconds from
    the cycle; None when the nodes wait on work with no max runtime, so nothing may
    backfill)."""

    workload: str
    nodes: tuple[str, ...]
    starts_in: float | None


@dataclass(frozen=True, slots=True)
class Decisions:
    """What one cycle decided.

    Apply `evictions` first, then `bindings`: a workload may appear in both when it is
    moved (consolidation). `bindings` maps a workload to the placements of the tasks it
    starts this cycle (a growing elastic workload lists only its new tasks).
    `pending` gives the reason for every workload that wanted to run more and could not.
    `reservations` lists the nodes held for pending workloads, by workload (empty unless
    a queue sets `reserve_after`).
    """

    bindings: Mapping[str, tuple[Placement, ...]]
    evictions: tuple[Eviction, ...]
    pending: Mapping[str, str]
    queues: Mapping[str, QueueStatus]
    # When node pools are in use: each pool's queue totals (`queues` adds them up).
    pools: Mapping[str, Mapping[str, QueueStatus]] = field(default_factory=dict)

    reservations: Mapping[str, Reservation] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.bindings or self.evictions)
