"""Work that can never run: the rules behind an honest refusal at submit, and the
scheduler's "never fits" pending reason.

Never means: some task is larger than every node (or device) it may use, the gang's
minimum is more than all those nodes hold together, or it is more than its project's or a
department's GPU limit. Whether one task is larger than every node is one rule
(`too_big`), worded twice: the server refuses a submission with it (`never_fits`, over
every registered node its node selector allows: cordoned ones may come back), and the
scheduling cycle gives it as a pending reason (over the schedulable nodes it may use now,
in the pool it tries). When no node matches at all, nodes may still join, so the work is
accepted and waits. Everything else (busy GPUs, a deserved quota in use, a required
topology) is a wait, which `corral why` explains.

A workload that names node pools runs in one of them, each a cluster of its own
(`engine.pools`): it never runs when it never runs in any of them, each judged on its own
nodes and with each queue's limit in that pool. A pool none of whose nodes it may use yet
may still get some, so such a workload is accepted and waits, as for a selector.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.model import Node, Queue
from corral.model.resources import EPSILON, format_gpus, format_memory, plural_gpus
from corral.model.spec import WorkloadSpec
from corral.model.types import TaskGroup

# The nodes and queues a submission is checked against.
Shape = tuple[tuple[Node, ...], tuple[Queue, ...]]
# Where in the request the problem is (("tasks", 0, "gpu")), and what it is.
Problem = tuple[tuple[str | int, ...], str]


@dataclass(frozen=True, slots=True)
class Largest:
    """The largest of each resource among some nodes: GPUs of a node, memory of a device
    (of a node with GPUs), CPU cores and memory of a node."""

    gpus: int
    gpu_memory: int
    cpu: float
    memory: int

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> Largest | None:
        """The largest of `nodes`; None when there are none."""
        gpus = gpu_memory = memory = 0
        cpu = 0.0
        found = False
        for node in nodes:
            found = True
            gpus = max(gpus, node.gpus)
            if node.gpus:
                gpu_memory = max(gpu_memory, node.gpu_memory)
            cpu = max(cpu, node.cpu)
            memory = max(memory, node.memory)
        return cls(gpus, gpu_memory, cpu, memory) if found else None


def too_big(group: TaskGroup, largest: Largest) -> str | None:
    """The field of `group` ("gpu", "gpu_memory", "cpu", "memory") of which one task asks
    more than the `largest` node or device has, even empty; None when it may fit."""
    if group.gpu >= 1 and group.gpu > largest.gpus:
        return "gpu"
    # A fraction still needs a device to share.
    if 0 < group.gpu < 1 and largest.gpus == 0:
        return "gpu"
    if group.gpu_memory > largest.gpu_memory:
        return "gpu_memory"
    if group.cpu > largest.cpu + EPSILON:
        return "cpu"
    if group.memory > largest.memory:
        return "memory"
    return None


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the nodes that a node selector allows hold: the largest of each resource, all
    their GPUs together, and how many whole-GPU tasks of each size fit."""

    nodes: tuple[Node, ...]
    largest: Largest
    gpus: int
    _slots: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> Capacity | None:
        """The capacity of `nodes`; None when there are none."""
        largest = Largest.of(nodes)
        if largest is None:
            return None
        return cls(tuple(nodes), largest, sum(node.gpus for node in nodes))

    def slots(self, size: int) -> int:
        """How many tasks of `size` whole GPUs the nodes hold at once."""
        slots = self._slots.get(size)
        if slots is None:
            slots = self._slots[size] = sum(node.gpus // size for node in self.nodes)
        return slots


# What the nodes a node selector allows in some node pools (all pools: none) hold.
CapacityOf = Callable[[Mapping[str, tuple[str, ...]], tuple[str, ...]], Capacity | None]


class Summary:
    """A shape with its queues by name and its capacity per node selector and node pools,
    worked out when first asked for, so that a check costs the same on 10 nodes as on
    10,000."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.queues = {queue.name: queue for queue in shape[1]}
        self._capacities: dict[
            tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[str, ...]], Capacity | None
        ] = {}

    def capacity(
        self, selector: Mapping[str, tuple[str, ...]], pools: tuple[str, ...] = ()
    ) -> Capacity | None:
        """What the nodes `selector` allows in `pools` (in any pool when empty) hold; None
        when none match."""
        key = (tuple(sorted(selector.items())), pools)
        if key not in self._capacities:
            allowed = [
                node
                for node in self.shape[0]
                if selected(node, selector) and (not pools or node.pool in pools)
            ]
            self._capacities[key] = Capacity.of(allowed)
        return self._capacities[key]

    def matches(self, spec: WorkloadSpec) -> bool:
        """Whether some node of the shape is one `spec` may use, in each pool it names:
        else nodes that joined since may change the answer."""
        if not spec.node_pools:
            return self.capacity(spec.node_selector) is not None
        selector = spec.node_selector
        return all(self.capacity(selector, (pool,)) is not None for pool in spec.node_pools)

    def never_fits(self, spec: WorkloadSpec) -> Problem | None:
        """As the module's `never_fits`, on this shape."""
        return _never_fits(spec, self.capacity, self.queues)


def never_fits(
    spec: WorkloadSpec, nodes: Sequence[Node], queues: Sequence[Queue]
) -> Problem | None:
    """Where and why `spec` can never run on `nodes` under `queues`' limits,
    or None when it may (perhaps after waiting)."""
    return Summary((tuple(nodes), tuple(queues))).never_fits(spec)


def _never_fits(
    spec: WorkloadSpec, capacity: CapacityOf, queues: Mapping[str, Queue]
) -> Problem | None:
    minimum = minimum_gang(spec)
    if spec.node_pools:
        return _never_fits_in_pools(spec, capacity, queues, minimum)
    need = sum(group.gpu * count for group, count in minimum)
    problem = _over_limit(spec.project, need, spec.min_available is not None, queues)
    if problem is not None:
        return problem
    allowed = capacity(spec.node_selector, ())
    if allowed is None:
        return None
    return _too_small(spec, minimum, allowed, _matching(spec))


def _never_fits_in_pools(
    spec: WorkloadSpec,
    capacity: CapacityOf,
    queues: Mapping[str, Queue],
    minimum: Sequence[tuple[TaskGroup, int]],
) -> Problem | None:
    """Why `spec` never runs in any of its node pools, or None. Worded over its pools
    together where that holds ("no node of pool a100 or h100 has 16 GPUs"), else pool by
    pool, as the pending reason is ("pool a100: ...; pool h100: ...")."""
    need = sum(group.gpu * count for group, count in minimum)
    elastic = spec.min_available is not None
    matching = _matching(spec)
    pools = spec.node_pools
    problems: list[Problem] = []
    # Whether some pool is over a limit, and whether each has nodes it may use.
    limited = False
    everywhere = True
    for pool in pools:
        allowed = capacity(spec.node_selector, (pool,))
        everywhere = everywhere and allowed is not None
        problem = _over_limit(spec.project, need, elastic, queues, pool)
        limited = limited or problem is not None
        if problem is None:
            if allowed is None:
                return None
            problem = _too_small(spec, minimum, allowed, f" of the pool{matching}")
            if problem is None:
                return None
        problems.append(problem)
    if len(pools) == 1 and limited:
        path, message = problems[0]
        return path, f"{message} in pool {pools[0]}"
    together = capacity(spec.node_selector, pools) if everywhere else None
    if together is not None:
        # Too small for all its pools' nodes together is too small in each: said once.
        problem = _too_small(spec, minimum, together, f" of pool {_either(pools)}{matching}")
        if problem is not None:
            return problem
    paths = [path for path, _ in problems]
    common = 0
    while all(len(path) > common and path[common] == paths[0][common] for path in paths):
        common += 1
    parts = zip(pools, problems, strict=True)
    text = "; ".join(f"pool {pool}: {message}" for pool, (_, message) in parts)
    return paths[0][:common], text


def _matching(spec: WorkloadSpec) -> str:
    return " matching its node selector" if spec.node_selector else ""


def _either(names: Sequence[str]) -> str:
    """ "a", "a or b", "a, b or c"."""
    if len(names) == 1:
        return names[0]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _too_small(
    spec: WorkloadSpec,
    minimum: Sequence[tuple[TaskGroup, int]],
    allowed: Capacity,
    where: str,
) -> Problem | None:
    """Why `spec` never runs on the `allowed` nodes (`where` they are, in the words of a
    refusal): a task larger than each, or a minimum gang larger than all together."""
    for index, group in enumerate(spec.task_groups):
        reason = _too_big(group, allowed.largest, where)
        if reason is not None:
            return ("tasks", index, reason[0]), reason[1]
    need = sum(group.gpu * count for group, count in minimum)
    if need > allowed.gpus + EPSILON:
        count = sum(count for _, count in minimum)
        return (
            ("tasks",),
            f"the gang needs {plural_gpus(need)} at once ({count} tasks); all the nodes{where}"
            f" have {plural_gpus(allowed.gpus)} together",
        )
    for group, count in minimum:
        if group.gpu >= 1:
            slots = allowed.slots(int(group.gpu))
            if count > slots:
                return (
                    ("tasks",),
                    f"the gang needs {count} tasks of {plural_gpus(group.gpu)} at once; the "
                    f"nodes{where} can hold {slots} such tasks",
                )
    return None


def minimum_gang(spec: WorkloadSpec) -> list[tuple[TaskGroup, int]]:
    """The task groups and how many of each must start together: every task, or the
    first `min_available` in order for an elastic workload."""
    left = spec.min_available
    taken = []
    for group in spec.task_groups:
        count = group.replicas if left is None else min(group.replicas, left)
        if count:
            taken.append((group, count))
        if left is not None:
            left -= count
    return taken


def selected(node: Node, selector: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether `node` has the labels `selector` asks for."""
    return all(node.label(key) in values for key, values in selector.items())


def _too_big(group: TaskGroup, largest: Largest, where: str) -> tuple[str, str] | None:
    """The field of the task group and the reason why one task of `group` fits no node,
    in the words of a refused submission."""
    resource = too_big(group, largest)
    if resource == "gpu" and group.gpu >= 1:
        return (
            "gpu",
            f"no node{where} has {plural_gpus(group.gpu)}; the largest has {largest.gpus}",
        )
    if resource == "gpu":
        return "gpu", f"no node{where} has a GPU"
    if resource == "gpu_memory":
        memory = largest.gpu_memory
        has = f"the largest has {format_memory(memory)}" if memory else "none has a GPU"
        return (
            "gpu_memory",
            f"no GPU{where} has {format_memory(group.gpu_memory)} of memory; {has}",
        )
    if resource == "cpu":
        return (
            "cpu",
            f"no node{where} has {format_gpus(group.cpu)} CPU cores; the largest has "
            f"{format_gpus(largest.cpu)}",
        )
    if resource == "memory":
        return (
            "memory",
            f"no node{where} has {format_memory(group.memory)} of memory; the largest has "
            f"{format_memory(largest.memory)}",
        )
    return None


def _over_limit(
    project: str,
    need: float,
    elastic: bool,
    by_name: Mapping[str, Queue],
    pool: str | None = None,
) -> Problem | None:
    """Why `need` GPUs at once exceed the GPU limit of the project or an ancestor (its
    limit in `pool`, when given: a gang runs in one pool)."""
    queue = by_name.get(project)
    seen: set[str] = set()
    while queue is not None and queue.name not in seen:
        seen.add(queue.name)
        limit = (queue.limit if pool is None else queue.quota_in(pool).limit).gpu
        if not math.isinf(limit) and need > limit + EPSILON:
            kind = "project" if queue.name == project else "department"
            what = "its minimum" if elastic else "it"
            return (
                ("tasks",),
                f"{what} needs {plural_gpus(need)} at once, more than {kind} {queue.name}'s "
                f"limit of {plural_gpus(limit)}",
            )
        queue = by_name.get(queue.parent) if queue.parent else None
    return None
