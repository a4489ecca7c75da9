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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
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


class Summary:
    """A shape with its queues by name and its capacity per node selector, worked out
    when first asked for, so that a check costs the same on 10 nodes as on 10,000."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.queues = {queue.name: queue for queue in shape[1]}
        self._capacities: dict[tuple[tuple[str, tuple[str, ...]], ...], Capacity | None] = {}

    def capacity(self, selector: Mapping[str, tuple[str, ...]]) -> Capacity | None:
        """What the nodes `selector` allows hold; None when none match."""
        key = tuple(sorted(selector.items()))
        if key not in self._capacities:
            allowed = [node for node in self.shape[0] if selected(node, selector)]
            self._capacities[key] = Capacity.of(allowed)
        return self._capacities[key]

    def never_fits(self, spec: WorkloadSpec) -> Problem | None:
        """As the module's `never_fits`, on this shape."""
        return _never_fits(spec, self.capacity(spec.node_selector), self.queues)


def never_fits(
    spec: WorkloadSpec, nodes: Sequence[Node], queues: Sequence[Queue]
) -> Problem | None:
    """Where and why `spec` can never run on `nodes` under `queues`' limits,
    or None when it may (perhaps after waiting)."""
    allowed = [node for node in nodes if selected(node, spec.node_selector)]
    return _never_fits(spec, Capacity.of(allowed), {queue.name: queue for queue in queues})


def _never_fits(
    spec: WorkloadSpec, allowed: Capacity | None, queues: Mapping[str, Queue]
) -> Problem | None:
    minimum = minimum_gang(spec)
    need = sum(group.gpu * count for group, count in minimum)
    problem = _over_limit(spec.project, need, spec.min_available is not None, queues)
    if problem is not None:
        return problem
    if allowed is None:
        return None
    where = " matching its node selector" if spec.node_selector else ""
    for index, group in enumerate(spec.task_groups):
        reason = _too_big(group, allowed.largest, where)
        if reason is not None:
            return ("tasks", index, reason[0]), reason[1]
    pool = allowed.gpus
    if need > pool + EPSILON:
        count = sum(count for _, count in minimum)
        return (
            ("tasks",),
            f"the gang needs {plural_gpus(need)} at once ({count} tasks); all the nodes{where}"
            f" have {plural_gpus(pool)} together",
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
    project: str, need: float, elastic: bool, by_name: Mapping[str, Queue]
) -> Problem | None:
    """Why `need` GPUs at once exceed the GPU limit of the project or an ancestor."""
    queue = by_name.get(project)
    seen: set[str] = set()
    while queue is not None and queue.name not in seen:
        seen.add(queue.name)
        limit = queue.limit.gpu
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
