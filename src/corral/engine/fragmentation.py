"""Expected GPU fragmentation of a node, against the shapes of the tasks a cycle sees.

After the measure of "Beware of Fragmentation" (USENIX ATC'23): for one shape of task, the
free GPU capacity of a node that the shape cannot use is fragmented; weighing each shape
by how many tasks of it the snapshot holds (pending and running) gives the node's expected
fragmentation. A shape cannot use any of a node's free GPUs when its node selector does
not match the node, when the node lacks the CPU for it, or when it asks for no GPU; a
whole-GPU shape of n devices cannot use partly used devices, nor the wholly free ones
beyond a multiple of n; a fractional shape cannot use devices with less free than it
asks for. Like the paper's measure, shapes are GPUs and CPU: host memory is checked when
a task is placed but left out of the shapes (it rarely binds on GPU nodes, and it splits
shapes that differ in nothing else; with it the Alibaba figure was 0.4 points worse).

Beyond the paper's measure, free GPUs need CPU. At the CPU per GPU that the GPU shapes a
node hosts ask for on average, the free GPU capacity of the node beyond what its free CPU
serves is stranded, lost to all of those shapes. A shape's own CPU check sees a node's CPU
only once it falls below one task's; this term sees a task take more CPU than its GPUs'
share, so CPU-hungry tasks go where CPU is plentiful and CPU-light ones where it is short,
to the GPUs that CPU-poor nodes could not serve otherwise. That pull is left out on nodes
that some shape may use only because of its node selector: there it would fill with work
that could go anywhere the GPUs that only the selective shapes can use. (On the Alibaba
trace: 4.17% of GPUs unallocated instead of 4.94%; with GPU-model constraints on a third of
the tasks 12.52% instead of 12.61%, while with the pull everywhere it was 13.95%.)

Placing a task where it raises the expected fragmentation least keeps free capacity in
the forms the workload will ask for. Only the change matters, so the model counts the
opposite, the capacity each shape can use, and scores a placement by how much of it is
lost (plus the constant term of the GPUs taken). Node states repeat (every idle node of
one kind looks the same), so usable capacity is remembered per state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from corral.model import Node, TaskGroup, Workload
from corral.model.resources import EPSILON

# The most common shapes are enough: the rest weigh little and each shape costs time.
# (On the Alibaba trace 48 shapes left 4.98% unallocated, 128 4.86%; with GPU-model
# constraints on a third of the tasks, 48 left 13.64%, 256 12.61%.)
MAX_SHAPES = 256

Selector = tuple[tuple[str, tuple[str, ...]], ...]
# (GPUs: a whole count, a fraction or 0; CPU cores; node selector)
Shape = tuple[float, float, Selector]
# A node's state as the model sees it: its kind, free share of each device (largest
# first) and free CPU.
NodeKey = tuple[int, tuple[float, ...], float]


def shapes_of(workloads: Iterable[tuple[Workload, int]], max_device_memory: int) -> Counter[Shape]:
    """Tasks per shape over `workloads` (each with how many times it counts); a
    GPU-memory request counts as its share of the largest device."""
    counts: Counter[Shape] = Counter()
    for workload, times in workloads:
        for shape, tasks in task_shapes(workload, max_device_memory):
            counts[shape] += tasks * times
    return counts


def task_shapes(workload: Workload, max_device_memory: int) -> list[tuple[Shape, int]]:
    """The shapes of a workload's tasks, each with how many of its tasks have it."""
    selector = tuple(sorted(workload.node_selector.items()))
    return [
        ((_nominal(group, max_device_memory), group.cpu, selector), group.replicas)
        for group in workload.task_groups
    ]


def _nominal(group: TaskGroup, max_device_memory: int) -> float:
    if group.gpu_memory > 0 and max_device_memory:
        return min(1.0, group.gpu_memory / max_device_memory)
    return group.gpu


class NodeClasses:
    """A cluster's nodes grouped by all that the model reads of them (devices, device
    memory, CPU, memory, GPU model, labels), the groups in the order each first appears
    among the nodes. Worked out once for a set of nodes, so that each cycle's model
    looks at a group once rather than at every node of it."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        numbers: dict[tuple[object, ...], int] = {}
        # One node of each group, and each node's group by name.
        self.first: list[Node] = []
        self.of: dict[str, int] = {}
        for node in nodes:
            key = (
                node.gpus,
                node.gpu_memory,
                node.cpu,
                node.memory,
                node.gpu_model,
                tuple(sorted(node.labels.items())),
            )
            number = numbers.get(key)
            if number is None:
                number = numbers[key] = len(self.first)
                self.first.append(node)
            self.of[node.name] = number


class Fragmentation:
    """The expected-fragmentation model of one cycle: kinds of node and the shapes each
    kind can host."""

    def __init__(self, classes: NodeClasses, shapes: Mapping[Shape, float]) -> None:
        # Heaviest shapes first; ties in shape order, so the choice is deterministic.
        ranked = sorted(shapes.items(), key=lambda item: (-item[1], item[0]))[:MAX_SHAPES]
        total = float(sum(weight for _, weight in ranked)) or 1.0
        gpu_shapes = [(shape, weight / total) for shape, weight in ranked if shape[0]]
        # Nodes of one kind have the same capacity and host the same shapes: the kind of
        # each group of NodeClasses.
        self.kind_of_class: list[int] = []
        kinds: dict[tuple[object, ...], int] = {}
        self._whole: list[list[tuple[int, float, float]]] = []
        self._fraction: list[list[tuple[float, float, float]]] = []
        # Per kind: the CPU per GPU its GPU shapes ask for on average, their weight, and
        # whether any of them is bound to the kind by a node selector.
        self._cpu_rate: list[tuple[float, float, bool]] = []
        # Which shapes a node hosts depends only on its labels that selectors name.
        named = sorted({key for shape, _ in gpu_shapes for key, _ in shape[2]})
        hosted_by: dict[tuple[str | None, ...], tuple[int, ...]] = {}
        for node in classes.first:
            labels = tuple(node.label(key) for key in named)
            hosts = hosted_by.get(labels)
            if hosts is None:
                hosts = hosted_by[labels] = tuple(
                    at
                    for at, (shape, _) in enumerate(gpu_shapes)
                    if all(node.label(key) in values for key, values in shape[2])
                )
            key = (node.gpus, node.gpu_memory, node.cpu, node.memory, hosts)
            number = kinds.get(key)
            if number is None:
                number = kinds[key] = len(kinds)
                hosted = [gpu_shapes[at] for at in hosts]
                self._whole.append(
                    [(int(s[0]), s[1], w) for s, w in hosted if 1 <= s[0] <= node.gpus]
                )
                self._fraction.append([(s[0], s[1], w) for s, w in hosted if s[0] < 1])
                asked = sum(s[0] * w for s, w in hosted)
                cpu_asked = sum(s[1] * w for s, w in hosted)
                self._cpu_rate.append(
                    (
                        cpu_asked / asked if asked else 0.0,
                        sum(w for _, w in hosted),
                        any(s[2] for s, _ in hosted),
                    )
                )
            self.kind_of_class.append(number)
        self._usable: dict[NodeKey, float] = {}
        self._changes: dict[
            tuple[int, tuple[float, ...], float, tuple[int, ...], float, float], float
        ] = {}

    def usable(self, key: NodeKey) -> float:
        """GPU capacity of a node in state `key` that the shapes can use, weighted."""
        found = self._usable.get(key)
        if found is not None:
            return found
        number, frees, cpu = key
        cpu += EPSILON
        whole = sum(1 for free in frees if free >= 1.0 - EPSILON)
        largest = frees[0] if frees else 0.0
        total = 0.0
        for count, need_cpu, weight in self._whole[number]:
            if count <= whole and need_cpu <= cpu:
                total += weight * (whole - whole % count)
        for gpu, need_cpu, weight in self._fraction[number]:
            if gpu <= largest + EPSILON and need_cpu <= cpu:
                total += weight * sum(free for free in frees if free + EPSILON >= gpu)
        self._usable[key] = total
        return total

    def stranded(self, number: int, frees: Sequence[float], cpu: float) -> float:
        """Free GPU capacity (shares `frees`) of a node of kind `number` that `cpu` free
        cores cannot serve at the CPU per GPU its GPU shapes ask for on average."""
        rate = self._cpu_rate[number][0]
        if not rate:
            return 0.0
        return max(0.0, sum(frees) - max(cpu, 0.0) / rate)

    def change(
        self,
        number: int,
        used: Sequence[float],
        free_cpu: float,
        devices: Sequence[int],
        per_device: float,
        cpu: float,
    ) -> float:
        """How much a node's expected fragmentation grows when a task takes `per_device`
        of each of `devices` and `cpu` cores of the host (in GPUs, weighted)."""
        # Many nodes are in the same state (a cluster starts empty): score each once.
        key = (number, tuple(used), free_cpu, tuple(devices), per_device, cpu)
        found = self._changes.get(key)
        if found is not None:
            return found
        before = tuple(sorted((round(1.0 - value, 9) for value in used), reverse=True))
        after_used = list(used)
        for device in devices:
            after_used[device] = after_used[device] + per_device
        after = tuple(sorted((round(1.0 - value, 9) for value in after_used), reverse=True))
        after_cpu = round(free_cpu - cpu, 9)
        lost = self.usable((number, before, free_cpu)) - self.usable((number, after, after_cpu))
        # GPUs the CPU left cannot serve are lost to every GPU shape the node hosts; fewer
        # of them count as a gain only where no shape is bound by its node selector.
        _, weight, selective = self._cpu_rate[number]
        stranded = self.stranded(number, after, after_cpu) - self.stranded(number, before, free_cpu)
        if selective:
            stranded = max(stranded, 0.0)
        lost += weight * stranded
        # Every shape counts the GPUs taken as no longer free: fragmentation falls by them.
        found = self._changes[key] = lost - per_device * len(devices)
        return found
