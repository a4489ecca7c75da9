"""Hypothesis strategies for the engine's property tests.

`cases()` draws a valid cluster (nodes, a queue tree, workloads), a consistent running
state and a scheduler configuration. Running states come three ways: none at all (every
workload pending), a simple placer written here that keeps every rule the engine keeps
(devices, CPU and memory, gangs, selectors, required topology, limits, non-preemptible
work within deserved), or one or two engine cycles over an all-pending cluster. After
that, new pending workloads may arrive, queue quotas may change and nodes may be
cordoned, as between two cycles of a real server. `python_code` renders a drawn case as
Python, for bug reports and regression examples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass, replace
from typing import Any

from hypothesis import strategies as st

from corral.engine import apply_decisions, schedule
from corral.model import (
    GIB,
    Node,
    Placement,
    Queue,
    Resources,
    SchedulerConfig,
    Snapshot,
    TaskGroup,
    Topology,
    Workload,
)
from corral.model.resources import UNLIMITED
from corral.model.types import ACTIONS, default_preemptible

# Tolerance of the checks: the engine rounds fractions to 1e-9.
TOLERANCE = 1e-6
INF = math.inf
MAX_WORKLOADS = 15

FRACTIONS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.9)
PRIORITIES = (50, 50, 75, 100, 125)
GPU_QUOTAS = (0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
SELECTORS: tuple[Mapping[str, tuple[str, ...]], ...] = (
    {"pool": ("a",)},
    {"pool": ("b",)},
    {"pool": ("a", "b")},
    {"gpu_model": ("A",)},
    {"gpu_model": ("B",)},
    {"rack": ("r1",)},
    {"gpu_model": ("A",), "pool": ("a",)},
)


@dataclass(frozen=True)
class Case:
    """One drawn input: the snapshot before the cycle and the configuration to run."""

    snapshot: Snapshot
    config: SchedulerConfig
    origin: str


# -- nodes -------------------------------------------------------------------------------


@st.composite
def node_tuples(draw: st.DrawFn) -> tuple[Node, ...]:
    count = draw(st.integers(1, 6))
    nodes = []
    for index in range(count):
        labels: dict[str, str] = {}
        rack = draw(st.sampled_from(("r1", "r2", "r1", "r2", None)))
        if rack is not None:
            labels["rack"] = rack
        pool = draw(st.sampled_from(("a", "b", None)))
        if pool is not None:
            labels["pool"] = pool
        nodes.append(
            Node(
                name=f"node{index}",
                # The first node has GPUs so that some work always fits somewhere.
                gpus=draw(st.integers(1 if index == 0 else 0, 8)),
                gpu_memory=draw(st.sampled_from((40 * GIB, 80 * GIB))),
                gpu_model=draw(st.sampled_from(("A", "B"))),
                cpu=draw(st.sampled_from((8.0, 32.0, 64.0))),
                memory=draw(st.sampled_from((64 * GIB, 256 * GIB))),
                labels=labels,
            )
        )
    return tuple(nodes)


# -- queues ------------------------------------------------------------------------------


@st.composite
def quota_fields(draw: st.DrawFn) -> dict[str, Any]:
    """deserved, limit (None or at least deserved), over-quota weight and priority."""
    deserved = Resources(
        draw(st.sampled_from(GPU_QUOTAS)),
        draw(st.sampled_from((INF, INF, INF, 0.0, 4.0, 16.0))),
        draw(st.sampled_from((INF, INF, INF, 16.0 * GIB, 128.0 * GIB))),
    )
    if draw(st.integers(0, 3)):
        limit = UNLIMITED
    else:
        limit = Resources(
            deserved.gpu + draw(st.sampled_from((0.0, 0.5, 1.0, 2.0, 4.0, 8.0))),
            deserved.cpu + draw(st.sampled_from((0.0, 4.0, INF))),
            deserved.memory + draw(st.sampled_from((0.0, 64.0 * GIB, INF))),
        )
    return {
        "deserved": deserved,
        "limit": limit,
        "over_quota_weight": Resources(draw(st.sampled_from((0.0, 1.0, 2.0, 3.0, 0.5))), 1.0, 1.0),
        "priority": draw(st.sampled_from((100, 100, 50, 150))),
    }


@st.composite
def queue_tuples(draw: st.DrawFn) -> tuple[Queue, ...]:
    """Flat projects, or one to three departments of one to three projects each."""
    queues = []
    if draw(st.booleans()):
        for project in range(draw(st.integers(1, 4))):
            queues.append(Queue(name=f"p{project}", **draw(quota_fields())))
        return tuple(queues)
    for department in range(draw(st.integers(1, 3))):
        name = f"d{department}"
        queues.append(Queue(name=name, **draw(quota_fields())))
        for project in range(draw(st.integers(1, 3))):
            queues.append(Queue(name=f"{name}p{project}", parent=name, **draw(quota_fields())))
    return tuple(queues)


def leaves(queues: Sequence[Queue]) -> list[str]:
    parents = {queue.parent for queue in queues}
    return [queue.name for queue in queues if queue.name not in parents]


@st.composite
def changed_quotas(draw: st.DrawFn, queues: tuple[Queue, ...]) -> tuple[Queue, ...]:
    """The same tree with new quotas for some queues (an administrator's edit)."""
    return tuple(
        replace(queue, **draw(quota_fields())) if draw(st.booleans()) else queue for queue in queues
    )


# -- workloads ---------------------------------------------------------------------------


@st.composite
def task_group_tuples(draw: st.DrawFn, max_gpus: int) -> tuple[TaskGroup, ...]:
    remaining = draw(st.integers(1, 4))
    count = draw(st.integers(1, min(2, remaining)))
    groups = []
    for index in range(count):
        last = index == count - 1
        replicas = remaining if last else draw(st.integers(1, remaining - (count - index - 1)))
        remaining -= replicas
        kind = draw(st.sampled_from(("whole", "whole", "fraction", "memory", "whole", "cpu")))
        gpu = 0.0
        gpu_memory = 0
        if kind == "whole":
            gpu = float(draw(st.integers(1, max(1, min(4, max_gpus)))))
        elif kind == "fraction":
            gpu = draw(st.sampled_from(FRACTIONS))
        elif kind == "memory":
            gpu_memory = draw(st.sampled_from((8, 20, 40, 60))) * GIB
        groups.append(
            TaskGroup(
                name=f"g{index}",
                replicas=replicas,
                gpu=gpu,
                gpu_memory=gpu_memory,
                cpu=draw(st.sampled_from((0.0, 0.0, 0.0, 1.0, 2.0, 8.0))),
                memory=draw(st.sampled_from((0, 0, 0, 8 * GIB, 32 * GIB))),
            )
        )
    return tuple(groups)


@st.composite
def workload_values(
    draw: st.DrawFn,
    name: str,
    queues: Sequence[str],
    max_gpus: int,
    submitted: float,
    priorities: Sequence[int] = PRIORITIES,
) -> Workload:
    groups = draw(task_group_tuples(max_gpus))
    count = sum(group.replicas for group in groups)
    priority = draw(st.sampled_from(priorities))
    explicit = draw(st.sampled_from((None, None, True, False)))
    selector = draw(st.sampled_from(({}, {}, {}, *SELECTORS)))
    topology = draw(st.sampled_from((None, None, Topology("rack", True), Topology("rack", False))))
    return Workload(
        name=name,
        queue=draw(st.sampled_from(queues)),
        task_groups=groups,
        priority=priority,
        preemptible=default_preemptible(priority) if explicit is None else explicit,
        min_available=draw(st.one_of(st.none(), st.integers(1, count))),
        node_selector=selector,
        topology=topology,
        submitted=submitted,
        idle=draw(st.booleans()),
    )


@st.composite
def workload_batch(
    draw: st.DrawFn,
    first: int,
    count: int,
    queues: Sequence[str],
    max_gpus: int,
    ties: bool,
    priorities: Sequence[int] = PRIORITIES,
) -> list[Workload]:
    """`count` pending workloads named w{first}...; with `ties`, pairs share a `submitted`
    so that only the name breaks the tie."""
    return [
        draw(
            workload_values(
                f"w{index}", queues, max_gpus, float(index // 2 if ties else index), priorities
            )
        )
        for index in range(first, first + count)
    ]


# -- a simple valid placer ---------------------------------------------------------------


def queue_paths(queues: Sequence[Queue]) -> dict[str, list[str]]:
    """Each queue's path to the root, itself first."""
    parent = {queue.name: queue.parent for queue in queues}
    paths = {}
    for name in parent:
        path: list[str] = []
        at: str | None = name
        while at is not None:
            path.append(at)
            at = parent[at]
        paths[name] = path
    return paths


def selector_matches(node: Node, selector: Mapping[str, tuple[str, ...]]) -> bool:
    return all(node.label(key) in values for key, values in selector.items())


class SimplePlacer:
    """First fit over nodes in a random order; refuses whatever the engine would refuse."""

    def __init__(self, nodes: Sequence[Node], queues: Sequence[Queue], rng: random.Random):
        self.nodes = list(nodes)
        self.queues = {queue.name: queue for queue in queues}
        self.paths = queue_paths(queues)
        self.rng = rng
        self.used = {node.name: [0.0] * node.gpus for node in nodes}
        self.cpu = {node.name: node.cpu for node in nodes}
        self.memory = {node.name: float(node.memory) for node in nodes}
        self.alloc = {name: [0.0, 0.0, 0.0] for name in self.queues}
        self.np_alloc = {name: [0.0, 0.0, 0.0] for name in self.queues}

    def run(self, workload: Workload, count: int) -> tuple[Placement, ...] | None:
        """Place the first `count` tasks, all or none, and commit them; None if they do
        not fit or would break a quota."""
        nodes = [node for node in self.nodes if selector_matches(node, workload.node_selector)]
        topology = workload.topology
        if topology is not None and topology.required:
            values = {node.label(topology.key) for node in nodes}
            domains = sorted(value for value in values if value is not None)
            if not domains:
                return None
            domain = self.rng.choice(domains)
            nodes = [node for node in nodes if node.label(topology.key) == domain]
        used = {name: list(devices) for name, devices in self.used.items()}
        cpu = dict(self.cpu)
        memory = dict(self.memory)
        placements = []
        for task, group in enumerate(workload.tasks()[:count]):
            order = list(nodes)
            self.rng.shuffle(order)
            for node in order:
                placement = _fit(node, group, task, used[node.name], cpu, memory)
                if placement is not None:
                    placements.append(placement)
                    break
            else:
                return None
        request = [
            sum(placement.gpu for placement in placements),
            sum(group.cpu for group in workload.tasks()[:count]),
            float(sum(group.memory for group in workload.tasks()[:count])),
        ]
        for name in self.paths[workload.queue]:
            queue = self.queues[name]
            limit = (queue.limit.gpu, queue.limit.cpu, queue.limit.memory)
            deserved = (queue.deserved.gpu, queue.deserved.cpu, queue.deserved.memory)
            for resource in range(3):
                if self.alloc[name][resource] + request[resource] > limit[resource] + 1e-9:
                    return None
                if (
                    not workload.preemptible
                    and self.np_alloc[name][resource] + request[resource]
                    > deserved[resource] + 1e-9
                ):
                    return None
        self.used, self.cpu, self.memory = used, cpu, memory
        for name in self.paths[workload.queue]:
            for resource in range(3):
                self.alloc[name][resource] += request[resource]
                if not workload.preemptible:
                    self.np_alloc[name][resource] += request[resource]
        return tuple(placements)


def _fit(
    node: Node,
    group: TaskGroup,
    task: int,
    used: list[float],
    cpu: dict[str, float],
    memory: dict[str, float],
) -> Placement | None:
    """Bind one task on `node` into the given tallies, or None if it does not fit."""
    if cpu[node.name] + 1e-9 < group.cpu or memory[node.name] < group.memory:
        return None
    if group.fractional:
        amount = group.gpu_on(node)
        if amount > 1.0:
            return None
        devices = [device for device in range(node.gpus) if used[device] + amount <= 1.0 + 1e-9]
        if not devices:
            return None
        device = devices[0]
        used[device] = round(used[device] + amount, 9)
        placement = Placement(task, node.name, (device,), amount)
    elif group.gpu >= 1:
        free = [device for device in range(node.gpus) if used[device] == 0.0]
        count = int(group.gpu)
        if len(free) < count:
            return None
        for device in free[:count]:
            used[device] = 1.0
        placement = Placement(task, node.name, tuple(free[:count]), float(count))
    else:
        placement = Placement(task, node.name, (), 0.0)
    cpu[node.name] -= group.cpu
    memory[node.name] -= group.memory
    return placement


# -- validity of a running state ---------------------------------------------------------


def physical_problems(snapshot: Snapshot) -> list[str]:
    """What is wrong with where the running tasks are: unknown nodes, device indices out
    of range, malformed placements, devices over 1.0, whole devices shared, CPU or memory
    over a node's capacity. Empty for a valid state."""
    problems: list[str] = []
    nodes = {node.name: node for node in snapshot.nodes}
    load: dict[tuple[str, int], float] = {}
    whole: dict[tuple[str, int], list[str]] = {}
    users: dict[tuple[str, int], list[str]] = {}
    cpu: dict[str, float] = {}
    memory: dict[str, float] = {}
    for workload in snapshot.workloads:
        for placement in workload.placements:
            where = f"{workload.name} task {placement.task} on {placement.node}"
            node = nodes.get(placement.node)
            if node is None:
                problems.append(f"{where}: unknown node")
                continue
            if not 0 <= placement.task < workload.task_count:
                problems.append(f"{where}: no such task")
                continue
            group = workload.task_group_of(placement.task)
            cpu[node.name] = cpu.get(node.name, 0.0) + group.cpu
            memory[node.name] = memory.get(node.name, 0.0) + group.memory
            devices = placement.devices
            if len(set(devices)) != len(devices):
                problems.append(f"{where}: devices {devices} repeat")
            for device in devices:
                if not 0 <= device < node.gpus:
                    problems.append(f"{where}: device {device} out of range 0..{node.gpus - 1}")
            if group.fractional:
                if len(devices) != 1:
                    problems.append(f"{where}: a fraction on devices {devices}")
                if abs(placement.gpu - group.gpu_on(node)) > TOLERANCE:
                    problems.append(f"{where}: gpu {placement.gpu}, wants {group.gpu_on(node)}")
            elif group.gpu >= 1:
                if len(devices) != int(group.gpu) or placement.gpu != float(int(group.gpu)):
                    problems.append(f"{where}: {devices} gpu {placement.gpu} for {group.gpu}")
            elif devices or placement.gpu:
                problems.append(f"{where}: a CPU-only task holds {devices}")
            share = placement.gpu / len(devices) if devices else 0.0
            for device in devices:
                key = (node.name, device)
                load[key] = load.get(key, 0.0) + share
                users.setdefault(key, []).append(workload.name)
                if not group.fractional:
                    whole.setdefault(key, []).append(workload.name)
    for (node_name, device), amount in sorted(load.items()):
        if amount > 1.0 + TOLERANCE:
            problems.append(f"{node_name} device {device} holds {amount:g} GPUs")
    for key, owners in sorted(whole.items()):
        if len(users[key]) > 1:
            problems.append(f"{key[0]} device {key[1]} is whole for {owners}: {users[key]}")
    for name, amount in sorted(cpu.items()):
        if amount > nodes[name].cpu + TOLERANCE:
            problems.append(f"{name} runs {amount:g} CPU cores of {nodes[name].cpu:g}")
    for name, amount in sorted(memory.items()):
        if amount > nodes[name].memory:
            problems.append(f"{name} runs {amount:g} bytes of memory of {nodes[name].memory}")
    return problems


def gang_problems(snapshot: Snapshot) -> list[str]:
    """Running workloads below their minimum gang, or with a task listed twice."""
    problems = []
    for workload in snapshot.workloads:
        if not workload.placements:
            continue
        tasks = [placement.task for placement in workload.placements]
        if len(set(tasks)) != len(tasks):
            problems.append(f"{workload.name} runs tasks {tasks}: a task twice")
        if len(set(tasks)) < workload.min_tasks:
            problems.append(f"{workload.name} runs {tasks}, below its minimum {workload.min_tasks}")
    return problems


# -- configurations ----------------------------------------------------------------------


@st.composite
def configs(draw: st.DrawFn) -> SchedulerConfig:
    actions: tuple[str, ...] = ACTIONS
    if draw(st.booleans()):
        order = draw(st.permutations(ACTIONS))
        actions = tuple(order[: draw(st.integers(1, len(ACTIONS)))])
    return SchedulerConfig(
        placement=draw(st.sampled_from(("binpack", "spread"))),
        gpu_placement=draw(st.sampled_from(("pack", "spread"))),
        actions=actions,
    )


# -- whole cases -------------------------------------------------------------------------


MODES = ("calm", "pressure", "fragmented")


@st.composite
def cases(draw: st.DrawFn, mode: str | None = None) -> Case:
    """A valid snapshot and a configuration, in one of three modes (None: any of them).

    calm: workloads of every priority, some running. pressure: low-priority work runs
    and more important work arrives, so reclaim and preempt have work to do. fragmented:
    small low-priority work is scattered over the nodes by the simple placer and larger
    work arrives, so consolidation has work to do.
    """
    if mode is None:
        mode = draw(st.sampled_from(MODES))
    nodes = draw(node_tuples())
    queues = draw(queue_tuples())
    leaf_names = leaves(queues)
    max_gpus = max(node.gpus for node in nodes)
    ties = draw(st.booleans())
    calm = mode == "calm"
    early, late = (PRIORITIES, PRIORITIES) if calm else ((50,), (50, 75, 100, 125))
    first = draw(st.integers(0 if calm else 3, 12))
    # Small shapes first when fragmenting: one whole GPU at most per task.
    early_gpus = 1 if mode == "fragmented" else max_gpus
    workloads = draw(workload_batch(0, first, leaf_names, early_gpus, ties, early))
    origins = {
        "calm": ("engine", "placer", "pending"),
        "pressure": ("engine", "placer"),
        "fragmented": ("placer",),
    }
    origin = draw(st.sampled_from(origins[mode]))
    if origin == "placer":
        placer = SimplePlacer(nodes, queues, draw(st.randoms(use_true_random=False)))
        running = []
        for workload in workloads:
            if draw(st.integers(0, 3)):
                count = draw(st.integers(workload.min_tasks, workload.task_count))
                placements = placer.run(workload, count)
                if placements is not None:
                    workload = replace(workload, placements=placements)
            running.append(workload)
        workloads = running
    snapshot = Snapshot(nodes, queues, tuple(workloads))
    if origin == "engine":
        for _ in range(draw(st.integers(1, 2))):
            after = apply_decisions(snapshot, schedule(snapshot, draw(configs())))
            # A broken cycle is caught by the tests of single cycles; here it only ends
            # the warm-up, so that every case starts from a valid state.
            if physical_problems(after) or gang_problems(after):
                break
            snapshot = after
    more = draw(st.integers(0 if calm else 1, MAX_WORKLOADS - first))
    if more:
        extra = draw(workload_batch(first, more, leaf_names, max_gpus, ties, late))
        snapshot = replace(snapshot, workloads=(*snapshot.workloads, *extra))
    if origin != "pending" and draw(st.booleans()):
        snapshot = replace(snapshot, queues=draw(changed_quotas(snapshot.queues)))
    if draw(st.integers(0, 4)) == 0:
        # An administrator cordons some nodes: their work keeps running, nothing new lands.
        cordoned = tuple(
            replace(node, schedulable=False) if draw(st.booleans()) else node
            for node in snapshot.nodes
        )
        snapshot = replace(snapshot, nodes=cordoned)
    return Case(snapshot, draw(configs()), f"{mode}, {origin}")


@st.composite
def churn_cases(draw: st.DrawFn) -> Case:
    """A cluster that tempts a cycle into an eviction that serves nobody: some GPUs free;
    a queue at about its deserved quota with more whole-GPU work pending; a queue under
    its deserved quota whose line starts with a gang too large for the room left, then
    fractions that would fit in it together. Any room freed by evicting the first queue's
    work could as well go back to that queue's own pending work."""
    nodes = tuple(
        Node(name=f"node{index}", gpus=draw(st.integers(2 if index == 0 else 1, 4)))
        for index in range(draw(st.integers(1, 2)))
    )
    capacity = sum(node.gpus for node in nodes)
    # GPUs the first queue runs and the second, with one or more left free.
    held = draw(st.integers(1, capacity - 1))
    own = draw(st.integers(0, capacity - held - 1))
    queues = (
        Queue(name="p0", deserved=Resources(float(held - draw(st.sampled_from((0, 0, 0, 1)))))),
        Queue(name="p1", deserved=Resources(float(capacity - held))),
    )
    placer = SimplePlacer(nodes, queues, draw(st.randoms(use_true_random=False)))
    workloads: list[Workload] = []

    def whole(name: str, queue: str, replicas: int = 1, gpu: float = 1.0) -> Workload:
        return Workload(
            name=name,
            queue=queue,
            task_groups=(TaskGroup(replicas=replicas, gpu=gpu),),
            priority=draw(st.sampled_from((50, 50, 75))),
            submitted=float(len(workloads)),
        )

    for queue, count in (("p0", held), ("p1", own)):
        for _ in range(count):
            workload = whole(f"w{len(workloads)}", queue)
            placements = placer.run(workload, 1)
            if placements is not None:
                workload = replace(workload, placements=placements)
            workloads.append(workload)
    free = capacity - sum(len(workload.placements) for workload in workloads)
    pending: list[Workload] = []
    # A gang larger than the room left: as one task of several GPUs, or several tasks.
    size = free + draw(st.integers(1, 2))
    gang = draw(st.sampled_from(((size, 1.0), (1, float(size)))))
    pending.append(whole(f"w{len(workloads)}", "p1", *gang))
    workloads.append(pending[-1])
    for _ in range(draw(st.integers(1, 4))):
        fraction = draw(st.sampled_from((0.25, 0.5, 0.5, 0.75)))
        workload = whole(f"w{len(workloads)}", "p1", 1, fraction)
        workloads.append(workload)
    for _ in range(draw(st.integers(1, 3))):
        workloads.append(whole(f"w{len(workloads)}", "p0"))
    # The first queue's pending work may be older than the second's: submitted in any
    # order, the gang still first in its line.
    if draw(st.booleans()):
        later = [workload for workload in workloads if not workload.placements]
        older = [
            replace(workload, submitted=-1.0 - index)
            for index, workload in enumerate(later)
            if workload.queue == "p0"
        ]
        rest = [workload for workload in workloads if workload.queue != "p0" or workload.placements]
        workloads = rest + older
    config = SchedulerConfig(
        placement=draw(st.sampled_from(("binpack", "spread"))),
        gpu_placement=draw(st.sampled_from(("pack", "spread"))),
    )
    return Case(Snapshot(nodes, queues, tuple(workloads)), config, "churn")


# -- rendering a case as Python, for reports and regression examples ---------------------


def python_code(value: object) -> str:
    """`value` as Python source, dataclass fields left out where they hold their default;
    assumes `from math import inf` and the corral.model names in scope."""
    if is_dataclass(value) and not isinstance(value, type):
        parts = []
        for item in fields(value):
            current = getattr(value, item.name)
            if item.default is not MISSING and current == item.default:
                continue
            if item.default_factory is not MISSING and current == item.default_factory():
                continue
            parts.append(f"{item.name}={python_code(current)}")
        return f"{type(value).__name__}({', '.join(parts)})"
    if isinstance(value, tuple):
        inner = ", ".join(python_code(item) for item in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return f"[{', '.join(python_code(item) for item in value)}]"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{python_code(k)}: {python_code(v)}" for k, v in value.items())
        return f"{{{inner}}}"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= GIB:
        whole, rest = divmod(value, GIB)
        if rest == 0:
            return f"{int(whole)} * GIB"
    return repr(value)
