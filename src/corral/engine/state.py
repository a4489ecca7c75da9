"""The tentative cluster state one cycle works on.

Every change (a task bound to devices, a task taken off them) goes through `bind` and
`unbind`, which keep the free-capacity indices and the queue totals up to date and
write an undo record to a journal. `checkpoint()` and `rollback()` let an action try a
candidate (evict some victims, place a workload) and undo it if it does not work out:
simulate, then commit or roll back. A state may be kept from one cycle to the next
(`engine.Scheduler`): what changed in between goes through `add` and `remove`.

Free capacity is indexed so that placement does not scan every node for every task:
nodes are bucketed by their number of wholly free devices, and partly used devices
sit in one list sorted by their free fraction.

A workload's state and the candidates the actions try to place (`WorkloadState`,
`Candidate`) refer to each other, so both live here, below the fairness order.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from corral.engine.admission import Largest
from corral.engine.fragmentation import NodeClasses, Shape
from corral.engine.kinds import CPU, GPU, MEMORY, Request
from corral.model import Node, Placement, Queue, QueueStatus, Resources, TaskGroup, Workload
from corral.model.resources import EPSILON

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[object, ...]:
    """Sort "node2" before "node10"."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name))


def _round(value: float) -> float:
    # Fractions are added and removed many times; rounding keeps 0.3 + 0.7 exactly 1.
    return round(value, 9)


# A queue's totals as last reported: fair share, allocated, requested (GPU, CPU, memory),
# its GPU weight and usage under time-decayed fair share (None: off).
ReportedTotals = tuple[list[float], list[float], list[float], float | None, float | None]


class NodeState:
    """Free capacity of one node and the use of each of its devices (0.0 to 1.0)."""

    __slots__ = (
        "free_cpu",
        "free_gpu",
        "free_memory",
        "free_whole",
        "index",
        "kind",
        "node",
        "pristine",
        "used",
    )

    def __init__(self, index: int, node: Node, kind: int = 0) -> None:
        self.index = index
        self.node = node
        # Nodes of one kind have the same capacity and host the same task shapes.
        self.kind = kind
        self.free_cpu = node.cpu
        self.free_memory = float(node.memory)
        self.used = [0.0] * node.gpus
        self.free_whole = node.gpus
        # The node's GPUs less the sum of `used`, kept up whenever `used` changes (it is
        # read for every node in some searches).
        self.free_gpu = float(node.gpus)
        # Schedulable and running nothing: every such node of a kind looks the same.
        self.pristine = False

    @property
    def name(self) -> str:
        return self.node.name

    def free_devices(self, count: int) -> tuple[int, ...]:
        """The `count` lowest-numbered wholly free devices (caller checked there are enough)."""
        if count == 1:
            return (self.used.index(0.0),)
        found = [device for device, used in enumerate(self.used) if used == 0.0]
        return tuple(found[:count])


class QueueState:
    """A queue's place in the tree, its quotas, fair share and running totals."""

    __slots__ = (
        "age",
        "alloc",
        "allotment",
        "children",
        "deserved",
        "fair_share",
        "limit",
        "min_runtime",
        "name",
        "np_alloc",
        "parent",
        "path",
        "priority",
        "queue",
        "requested",
        "reserve_after",
        "running_priorities",
        "stamp",
        "status",
        "weight",
    )

    def __init__(self, queue: Queue, age: int) -> None:
        self.queue = queue
        self.name = queue.name
        self.age = age
        self.priority = queue.priority
        self.deserved = [queue.deserved.gpu, queue.deserved.cpu, queue.deserved.memory]
        self.limit = [queue.limit.gpu, queue.limit.cpu, queue.limit.memory]
        self.weight = [
            queue.over_quota_weight.gpu,
            queue.over_quota_weight.cpu,
            queue.over_quota_weight.memory,
        ]
        self.parent: QueueState | None = None
        self.children: list[QueueState] = []
        # This queue and its ancestors, leaf first.
        self.path: list[QueueState] = []
        self.alloc = [0.0, 0.0, 0.0]
        self.np_alloc = [0.0, 0.0, 0.0]
        self.requested = [0.0, 0.0, 0.0]
        self.fair_share = [0.0, 0.0, 0.0]
        # How many of its workloads run (a task or more) at each priority: only work above
        # the lowest of them may preempt (a leaf's own; kept with the running tasks).
        self.running_priorities: Counter[int] = Counter()
        # The totals a cycle last reported, and what they were worked out from: a queue
        # kept from cycle to cycle whose totals stay the same reports the same object.
        self.status: tuple[ReportedTotals, QueueStatus] | None = None
        # Goes up whenever `alloc` or `np_alloc` changes, so that what is worked out from
        # them may be kept until then.
        self.stamp = 0
        # What the queue is entitled to now: its deserved quota or fair share, the larger
        # (see `set_fair_share`).
        self.allotment = list(self.deserved)
        # Seconds its work must have run before it is a victim, by eviction kind, as
        # inherited down the tree (set once the tree is built; 0 is off).
        self.min_runtime: dict[str, float] = {"preempt": 0.0, "reclaim": 0.0}
        # Seconds its head workload waits before it gets a reservation, as inherited down
        # the tree (0 is off).
        self.reserve_after = 0.0

    @property
    def leaf(self) -> bool:
        return not self.children

    def set_fair_share(self, share: list[float]) -> None:
        self.fair_share[:] = share
        deserved = self.deserved
        # The larger of the two, as max() picks it (the first of equals).
        self.allotment[:] = [
            share[0] if share[0] > deserved[0] else deserved[0],
            share[1] if share[1] > deserved[1] else deserved[1],
            share[2] if share[2] > deserved[2] else deserved[2],
        ]


@dataclass(slots=True)
class WorkloadState:
    """A workload during the cycle: its running tasks as they stand in the tentative state."""

    workload: Workload
    queue: QueueState
    tasks: list[TaskGroup]
    running: dict[int, Placement] = field(default_factory=dict)
    # Tasks that were running when the cycle began, where they were.
    original: dict[int, Placement] = field(default_factory=dict)
    # Placements of tasks started this cycle.
    started: dict[int, Placement] = field(default_factory=dict)
    reason: str | None = None
    # GPU, CPU and memory of all its tasks as the cycle began (see Session.request_of),
    # and the shapes of its tasks: kept with the workload from one cycle to the next.
    demand: Request | None = None
    # Its minimum gang as a candidate for placement, while no task runs. The two refer
    # to each other: `release` breaks the cycle when the workload's state is dropped.
    gang: Candidate | None = None
    shapes: list[tuple[Shape, int]] | None = None
    # Why its minimum gang fits no eligible node even when empty, once `sized`.
    never_fits: str | None = None
    sized: bool = False
    # What makes workloads alike (see `alike_kind`), once asked: one object for
    # equal ones, from `kinds`, the table the cycle (or the Scheduler) keeps.
    kinds: dict[object, object] | None = None
    kind: object | None = None

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def preemptible(self) -> bool:
        return self.workload.preemptible

    def release(self) -> None:
        """Drop what refers back to this state, so that reference counting frees it (the
        cycle collector would otherwise have every workload of a cycle to find)."""
        self.gang = None

    def alike_kind(self) -> object:
        """Its tasks, priority, preemptibility and placement constraints, as one object
        shared by every workload of the table `kinds` with the same (compared by
        identity: comparing the task groups field by field is slow)."""
        kind = self.kind
        if kind is None:
            workload = self.workload
            key = (
                workload.task_groups,
                workload.priority,
                workload.preemptible,
                workload.min_available,
                tuple(sorted(workload.node_selector.items())),
                workload.topology,
                workload.node_pools,
            )
            kind = self.kind = key if self.kinds is None else self.kinds.setdefault(key, key)
        return kind

    def unplaced(self) -> list[int]:
        """Task numbers not running, lowest first."""
        return [task for task in range(len(self.tasks)) if task not in self.running]


@dataclass(slots=True)
class Candidate:
    """Tasks of one workload to place together: its minimum gang, or one growth task."""

    workload: WorkloadState
    tasks: list[int]
    request: Request
    growth: bool


Allowed = frozenset[int] | None


@dataclass(slots=True)
class PlacementCaches:
    """What placement works out and keeps as long as the state: the schedulable nodes a
    node selector matches; the largest node among allowed ones; and what each bucket
    offers a task, with the bucket's stamp it was read at (see `ClusterState`)."""

    eligible: dict[tuple[tuple[str, tuple[str, ...]], ...], frozenset[int]] = field(
        default_factory=dict
    )
    largest: dict[Allowed, Largest | None] = field(default_factory=dict)
    buckets: dict[tuple[int, int, float, int, Allowed], tuple[int, list[int]]] = field(
        default_factory=dict
    )


_BIND = 0
_UNBIND = 1


class ClusterState:
    """Nodes, devices and queue totals, with an undo journal."""

    def __init__(self, nodes: tuple[Node, ...], queues: dict[str, QueueState]) -> None:
        """Empty nodes, all of one kind: `load` the running tasks, `set_kinds`, then
        `index()`."""
        ordered = sorted(nodes, key=lambda node: natural_key(node.name))
        self.nodes = [NodeState(index, node) for index, node in enumerate(ordered)]
        self.by_name = {state.name: state for state in self.nodes}
        # The nodes grouped as the fragmentation model sees them, each node's group, and
        # the kind of each group as last set.
        self.classes = NodeClasses(nodes)
        self._class_of = [self.classes.of[state.name] for state in self.nodes]
        self._kind_of_class: list[int] | None = None
        self.caches = PlacementCaches()
        self.queues = queues
        # How many elastic workloads have a task running (none: nothing may grow).
        self.elastic_running = 0
        self.max_devices = max((node.gpus for node in ordered), default=0)
        # The memory of the largest device (of a node with GPUs).
        self.max_memory = max((node.gpu_memory for node in ordered if node.gpus), default=0)
        # GPU, CPU and memory of the schedulable nodes: what fair shares divide.
        self.capacity = [0.0, 0.0, 0.0]
        for node in ordered:
            if node.schedulable:
                self.capacity[GPU] += node.gpus
                self.capacity[CPU] += node.cpu
                self.capacity[MEMORY] += node.memory
        self._kinds = 1
        # buckets[c]: schedulable nodes with exactly c wholly free devices, in name order
        # (the same list as kind_buckets[0] while every node is of one kind).
        self.buckets: list[SortedList] = []
        # kind_buckets[k][c]: the same, for the nodes of kind k.
        self.kind_buckets: list[list[SortedList]] = []
        # bucket_stamps[k][c]: changes whenever kind_buckets[k][c] or one of its nodes
        # changes (never back to an earlier value), so that what was read from a bucket
        # may be kept until then (see `Placer`).
        self.bucket_stamps: list[list[int]] = []
        self._stamp = 0
        # Per kind: its nodes' GPUs, and how many of its nodes are pristine (all of them in
        # the bucket of that many free devices).
        self.kind_gpus: list[int] = []
        self.pristine: list[int] = []
        # Partly used devices of schedulable nodes: (free fraction, node index, device).
        self.partial = SortedList()
        self.free_gpu = 0.0
        self.journal: list[tuple[int, WorkloadState, Placement]] = []
        # Nodes and leaf queues whose totals changed since they were last rounded.
        self._changed_nodes: set[NodeState] = set()
        self._changed_queues: set[QueueState] = set()

    def set_kinds(self, kind_of_class: list[int]) -> bool:
        """Say which nodes are alike (see NodeState.kind): the kind of each group of
        `classes`. Returns whether any node's kind changed: the indices must then be
        built again (`index()`)."""
        if kind_of_class == self._kind_of_class:
            return False
        self._kind_of_class = list(kind_of_class)
        changed = False
        for node in self.nodes:
            kind = kind_of_class[self._class_of[node.index]]
            if node.kind != kind:
                node.kind = kind
                changed = True
        self._kinds = max(kind_of_class, default=0) + 1
        return changed

    def load(self, workload: WorkloadState, placement: Placement) -> None:
        """Add a task that was running when the cycle began, without keeping the indices
        or the journal up to date (faster than `bind`): call `index()` after the last."""
        node = self.by_name[placement.node]
        group = workload.tasks[placement.task]
        node.free_cpu -= group.cpu
        node.free_memory -= group.memory
        if placement.devices:
            per_device = placement.gpu / len(placement.devices)
            used = node.used
            for device in placement.devices:
                before = used[device]
                # A whole device needs no rounding (the common case, and this is hot).
                after = 1.0 if before == 0.0 and per_device == 1.0 else _round(before + per_device)
                used[device] = after
                node.free_whole -= (before == 0.0) - (after == 0.0)
            node.free_gpu = node.node.gpus - sum(used)
        self._count(workload, placement, group, 1.0)
        if not workload.running:
            self._starts_running(workload)
        workload.running[placement.task] = placement

    def add(self, workload: WorkloadState, placement: Placement) -> None:
        """Add a running task between cycles: indices kept, no journal."""
        self._add(workload, placement)

    def remove(self, workload: WorkloadState) -> None:
        """Take off every running task of a workload between cycles: indices kept, no
        journal."""
        for placement in list(workload.running.values()):
            self._remove(workload, placement)

    def settle(self) -> None:
        """Round the totals that changed since they were last rounded. Rounded totals do
        not depend on the order tasks were added and taken off in, so a state kept from
        an earlier cycle and one built afresh agree exactly."""
        for node in self._changed_nodes:
            node.free_cpu = _round(node.free_cpu)
            node.free_memory = _round(node.free_memory)
            self._touch(node)
            if self.pristine:
                self._check_pristine(node)
        self._changed_nodes.clear()
        rounded: set[str] = set()
        for leaf in self._changed_queues:
            for queue in leaf.path:
                if queue.name not in rounded:
                    rounded.add(queue.name)
                    queue.alloc[:] = [_round(value) for value in queue.alloc]
                    queue.np_alloc[:] = [_round(value) for value in queue.np_alloc]
                    queue.stamp += 1
        self._changed_queues.clear()

    def index(self) -> None:
        """Round every total (see `settle`) and build the free-capacity indices from the
        nodes as they stand."""
        self.bucket_stamps = []
        self.pristine = []
        self._changed_nodes.update(self.nodes)
        self._changed_queues.update(queue for queue in self.queues.values() if queue.leaf)
        self.settle()
        self.kind_gpus = [0] * self._kinds
        self.pristine = [0] * self._kinds
        for node in self.nodes:
            self.kind_gpus[node.kind] = node.node.gpus
            node.pristine = False
            self._check_pristine(node)
        buckets: list[list[int]] = [[] for _ in range(self.max_devices + 1)]
        kind_buckets: list[list[list[int]]] = [
            [[] for _ in range(self.max_devices + 1)] for _ in range(self._kinds)
        ]
        partial = []
        free_gpu = 0.0
        for state in self.nodes:
            if not state.node.schedulable:
                continue
            buckets[state.free_whole].append(state.index)
            kind_buckets[state.kind][state.free_whole].append(state.index)
            for device, used in enumerate(state.used):
                free_gpu += 1.0 - used
                if 0.0 < used < 1.0:
                    partial.append((_round(1.0 - used), state.index, device))
        self.kind_buckets = [[SortedList(bucket) for bucket in kind] for kind in kind_buckets]
        # With one kind of node the two indices hold the same: one is kept for both.
        if self._kinds == 1:
            self.buckets = self.kind_buckets[0]
        else:
            self.buckets = [SortedList(bucket) for bucket in buckets]
        self._stamp += 1
        self.bucket_stamps = [[self._stamp] * len(kind) for kind in kind_buckets]
        self.partial = SortedList(partial)
        self.free_gpu = _round(free_gpu)

    # -- changes ---------------------------------------------------------------------

    def checkpoint(self) -> int:
        return len(self.journal)

    def rollback(self, mark: int) -> None:
        """Undo every change made since `checkpoint()` returned `mark`."""
        journal = self.journal
        while len(journal) > mark:
            kind, workload, placement = journal.pop()
            if kind == _BIND:
                self._remove(workload, placement)
            else:
                self._add(workload, placement)

    def bind(self, workload: WorkloadState, placement: Placement) -> None:
        self._add(workload, placement)
        self.journal.append((_BIND, workload, placement))

    def unbind(self, workload: WorkloadState, task: int) -> Placement:
        placement = workload.running[task]
        self._remove(workload, placement)
        self.journal.append((_UNBIND, workload, placement))
        return placement

    def _add(self, workload: WorkloadState, placement: Placement) -> None:
        self._use(workload, placement, 1.0)
        if not workload.running:
            self._starts_running(workload)
        workload.running[placement.task] = placement

    def _remove(self, workload: WorkloadState, placement: Placement) -> None:
        self._use(workload, placement, -1.0)
        del workload.running[placement.task]
        if not workload.running:
            self._stops_running(workload)

    def _starts_running(self, workload: WorkloadState) -> None:
        """Count a workload whose first task is being added as running."""
        workload.queue.running_priorities[workload.workload.priority] += 1
        if workload.workload.elastic:
            self.elastic_running += 1

    def _stops_running(self, workload: WorkloadState) -> None:
        """Uncount a workload whose last running task was taken off."""
        counts = workload.queue.running_priorities
        priority = workload.workload.priority
        if counts[priority] == 1:
            del counts[priority]
        else:
            counts[priority] -= 1
        if workload.workload.elastic:
            self.elastic_running -= 1

    def _use(self, workload: WorkloadState, placement: Placement, sign: float) -> None:
        node = self.by_name[placement.node]
        self._changed_nodes.add(node)
        self._changed_queues.add(workload.queue)
        self._touch(node)
        group = workload.tasks[placement.task]
        node.free_cpu -= sign * group.cpu
        node.free_memory -= sign * group.memory
        devices = placement.devices
        if devices:
            self._use_devices(node, devices, sign * placement.gpu / len(devices))
        if node.node.schedulable:
            self.free_gpu = _round(self.free_gpu - sign * placement.gpu)
            self._check_pristine(node)
        self._count(workload, placement, group, sign)

    def _check_pristine(self, node: NodeState) -> None:
        """Mark whether the node runs nothing, and keep its kind's count."""
        spec = node.node
        pristine = (
            spec.schedulable
            and node.free_whole == spec.gpus
            and node.free_cpu == spec.cpu
            and node.free_memory == spec.memory
        )
        if pristine != node.pristine:
            node.pristine = pristine
            self.pristine[node.kind] += 1 if pristine else -1

    def _use_devices(self, node: NodeState, devices: tuple[int, ...], share: float) -> None:
        """Add `share` (negative: take it off) to the use of each of `devices`, moving the
        node between the free-capacity indices."""
        schedulable = node.node.schedulable
        index = node.index
        buckets = self.buckets
        kind_buckets = self.kind_buckets[node.kind]
        if schedulable:
            kind_buckets[node.free_whole].discard(index)
            if buckets is not kind_buckets:
                buckets[node.free_whole].discard(index)
        used = node.used
        partial = self.partial
        for device in devices:
            before = used[device]
            after = _round(before + share)
            used[device] = after
            if before == 0.0:
                node.free_whole -= 1
            if after == 0.0:
                node.free_whole += 1
            if schedulable:
                if 0.0 < before < 1.0:
                    partial.discard((_round(1.0 - before), index, device))
                if 0.0 < after < 1.0:
                    partial.add((_round(1.0 - after), index, device))
        node.free_gpu = node.node.gpus - sum(used)
        if schedulable:
            kind_buckets[node.free_whole].add(index)
            if buckets is not kind_buckets:
                buckets[node.free_whole].add(index)
            self._touch(node)

    def _touch(self, node: NodeState) -> None:
        """Mark the bucket the node is in as changed."""
        if self.bucket_stamps:
            self._stamp += 1
            self.bucket_stamps[node.kind][node.free_whole] = self._stamp

    @staticmethod
    def _count(
        workload: WorkloadState, placement: Placement, group: TaskGroup, sign: float
    ) -> None:
        """Add (sign 1) or take off (sign -1) a task's amounts in its queues' totals."""
        amounts = (placement.gpu, group.cpu, float(group.memory))
        preemptible = workload.preemptible
        for queue in workload.queue.path:
            queue.stamp += 1
            alloc = queue.alloc
            alloc[GPU] += sign * amounts[GPU]
            alloc[CPU] += sign * amounts[CPU]
            alloc[MEMORY] += sign * amounts[MEMORY]
            if not preemptible:
                np_alloc = queue.np_alloc
                np_alloc[GPU] += sign * amounts[GPU]
                np_alloc[CPU] += sign * amounts[CPU]
                np_alloc[MEMORY] += sign * amounts[MEMORY]


def amounts_fit(used: list[float], request: Request, cap: list[float]) -> bool:
    """used + request <= cap on every resource, with rounding slack."""
    return (
        used[GPU] + request[GPU] <= cap[GPU] + EPSILON
        and used[CPU] + request[CPU] <= cap[CPU] + EPSILON
        and used[MEMORY] + request[MEMORY] <= cap[MEMORY] + EPSILON
    )


def as_resources(values: list[float]) -> Resources:
    """A queue's list of GPU, CPU and memory amounts as model Resources."""
    return Resources(values[GPU], values[CPU], values[MEMORY])
