"""Honest refusals: a submission that can never run on the cluster as it is is refused at
once (422 naming the field), rather than left pending for ever.

Never means: some task is larger than every node (or device) that its node selector
allows, the gang's minimum is more than all those nodes hold together, or it is more than
its project's or a department's GPU limit. These are refused, as Slurm refuses a job no
partition can hold: growing the cluster or a limit is an operator's act, after which the
work is submitted again. When no node matches at all (none registered yet, or none with
the selector's labels), nodes may still join, so the workload is accepted and its pending
reason says why it waits. Everything else (busy GPUs, a deserved quota in use, a required
topology) is a wait, which `corral why` explains.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.model import Node, Queue
from corral.model.resources import EPSILON, format_gpus, format_memory, plural_gpus
from corral.model.spec import WorkloadSpec
from corral.model.types import TaskGroup
from corral.store import Invalid, Store

Shape = tuple[tuple[Node, ...], tuple[Queue, ...]]
# Where in the request the problem is (("tasks", 0, "gpu")), and what it is.
Problem = tuple[tuple[str | int, ...], str]


class Admission:
    """Checks submissions against the cluster's shape. The shape is the one the scheduler's
    last cycle saw, in memory; since a node or a queue may have changed after it, a refusal
    is made only once the store, read afresh, confirms it (refusals are rare, so the
    common path reads nothing). Without a cycle yet (or on a server that runs no
    scheduler), or when none of the last cycle's nodes match the workload or its project
    is newer than that cycle, the store is read, again only when its generation moved.
    What the nodes hold is summed up once per shape and node selector (`Capacity`), so
    that a check costs the same on 10 nodes as on 10,000."""

    def __init__(self, store: Store, kept: Callable[[], Shape | None] = lambda: None) -> None:
        self.store = store
        self.kept = kept
        self._lock = threading.Lock()
        self._cached: tuple[int, Shape] | None = None
        # The summaries of the last shapes seen (the kept one and the store's).
        self._summaries: list[_Summary] = []

    def shape(self) -> Shape:
        """The nodes and queues as of the store's current generation."""
        generation = self.store.generation
        cached = self._cached
        if cached is not None and cached[0] == generation:
            return cached[1]
        with self._lock:
            shape = self.store.cluster_shape()
            self._cached = (generation, shape)
            return shape

    def accepts(self, spec: WorkloadSpec) -> bool:
        """True when the last cycle's shape, in memory, holds `spec` (it may run there);
        False when only `check` can tell (it may read the store). Reads nothing, so it
        may run on the event loop."""
        kept = self.kept()
        if kept is None:
            return False
        summary = self._summary(kept)
        # When none of its nodes match, or its project is newer than that cycle, the
        # store is asked.
        return (
            spec.project in summary.queues
            and summary.capacity(spec.node_selector) is not None
            and summary.never_fits(spec) is None
        )

    def check(self, spec: WorkloadSpec) -> None:
        """Raise Invalid when `spec` can never run here."""
        self.check_all([spec], None)

    def check_all(self, specs: Sequence[WorkloadSpec], at: str | None = "workloads") -> None:
        """Raise Invalid for the first of `specs` that can never run here, at its place
        in the request (`workloads[i]`; at the top when `at` is None). The store is read
        once at most, whatever their number: a batch of a thousand checked one by one
        read its generation a thousand times."""
        shape: Shape | None = None
        for index, spec in enumerate(specs):
            if self.accepts(spec):
                continue
            if shape is None:
                shape = self.shape()
            problem = self._summary(shape).never_fits(spec)
            if problem is not None:
                path, message = problem
                place = () if at is None else (at, index)
                raise Invalid(str(path[-1]), message, (*place, *path[:-1]))

    def _summary(self, shape: Shape) -> _Summary:
        # The scheduler's cycles hand on the same tuples while nodes and queues stay.
        for summary in self._summaries:
            if summary.shape[0] is shape[0] and summary.shape[1] is shape[1]:
                return summary
        summary = _Summary(shape)
        # Two: the kept shape and the store's, which alternate when they differ.
        self._summaries = [summary, *self._summaries[:1]]
        return summary


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the nodes that a node selector allows hold: the largest of each resource, all
    their GPUs together, and how many whole-GPU tasks of each size fit."""

    nodes: tuple[Node, ...]
    largest_gpus: int
    largest_gpu_memory: int
    largest_cpu: float
    largest_memory: int
    gpus: int
    _slots: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> Capacity | None:
        """The capacity of `nodes`; None when there are none."""
        if not nodes:
            return None
        return cls(
            tuple(nodes),
            max(node.gpus for node in nodes),
            max((node.gpu_memory for node in nodes if node.gpus), default=0),
            max(node.cpu for node in nodes),
            max(node.memory for node in nodes),
            sum(node.gpus for node in nodes),
        )

    def slots(self, size: int) -> int:
        """How many tasks of `size` whole GPUs the nodes hold at once."""
        slots = self._slots.get(size)
        if slots is None:
            slots = self._slots[size] = sum(node.gpus // size for node in self.nodes)
        return slots


class _Summary:
    """A shape with its queues by name and its capacity per node selector, worked out
    when first asked for."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.queues = {queue.name: queue for queue in shape[1]}
        self._capacities: dict[tuple[tuple[str, tuple[str, ...]], ...], Capacity | None] = {}

    def capacity(self, selector: Mapping[str, tuple[str, ...]]) -> Capacity | None:
        key = tuple(sorted(selector.items()))
        if key not in self._capacities:
            allowed = [node for node in self.shape[0] if _selected(node, selector)]
            self._capacities[key] = Capacity.of(allowed)
        return self._capacities[key]

    def never_fits(self, spec: WorkloadSpec) -> Problem | None:
        return _never_fits(spec, self.capacity(spec.node_selector), self.queues)


def never_fits(
    spec: WorkloadSpec, nodes: Sequence[Node], queues: Sequence[Queue]
) -> Problem | None:
    """Where and why `spec` can never run on `nodes` under `queues`' limits,
    or None when it may (perhaps after waiting)."""
    allowed = [node for node in nodes if _selected(node, spec.node_selector)]
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
        reason = _too_big(group, allowed, where)
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


def _selected(node: Node, selector: Mapping[str, tuple[str, ...]]) -> bool:
    return all(node.label(key) in values for key, values in selector.items())


def _too_big(group: TaskGroup, nodes: Capacity, where: str) -> tuple[str, str] | None:
    """The field of the task group and the reason why one task of `group` fits no node."""
    largest = nodes.largest_gpus
    if group.gpu >= 1 and group.gpu > largest:
        return (
            "gpu",
            f"no node{where} has {plural_gpus(group.gpu)}; the largest has {largest}",
        )
    if 0 < group.gpu < 1 and largest == 0:
        return "gpu", f"no node{where} has a GPU"
    memory = nodes.largest_gpu_memory
    if group.gpu_memory and group.gpu_memory > memory:
        has = f"the largest has {format_memory(memory)}" if memory else "none has a GPU"
        return (
            "gpu_memory",
            f"no GPU{where} has {format_memory(group.gpu_memory)} of memory; {has}",
        )
    cpu = nodes.largest_cpu
    if group.cpu > cpu + EPSILON:
        return (
            "cpu",
            f"no node{where} has {format_gpus(group.cpu)} CPU cores; the largest has "
            f"{format_gpus(cpu)}",
        )
    host_memory = nodes.largest_memory
    if group.memory > host_memory:
        return (
            "memory",
            f"no node{where} has {format_memory(group.memory)} of memory; the largest has "
            f"{format_memory(host_memory)}",
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
