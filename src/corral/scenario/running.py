"""Give the tasks a scenario says are running concrete devices, checking they fit."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.model import Node, Placement, TaskGroup, format_gpus, format_memory
from corral.model.resources import EPSILON
from corral.scenario.errors import FieldError


@dataclass(frozen=True, slots=True)
class RunningTask:
    """One running task as the file states it, before it has devices.

    `path` is the field that put it on its node (`workloads[2].nodes[1]`), for messages;
    `gpu_group_path` is the field naming its shared device group.
    """

    workload: str
    task: int
    group: TaskGroup
    node: str
    gpu_group: str | None
    path: str
    gpu_group_path: str


def assign_devices(
    nodes: Mapping[str, Node], tasks: Sequence[RunningTask]
) -> dict[str, tuple[Placement, ...]]:
    """Placements per workload for `tasks` (given in listing order), with device indices.

    Whole-GPU tasks take the lowest free devices of their node first, in listing order;
    then each gpu_group on a node gets the lowest unused device, shared by its tasks, and
    each fractional task without a group gets a device of its own. Raises
    FieldError when a node runs out of devices, CPU or memory, or a shared device
    would hold more than one GPU.
    """
    by_node: dict[str, list[RunningTask]] = defaultdict(list)
    for task in tasks:
        by_node[task.node].append(task)
    placements: dict[str, list[Placement]] = defaultdict(list)
    for node_name, node_tasks in by_node.items():
        for placement_of, placement in _place_on_node(nodes[node_name], node_tasks):
            placements[placement_of].append(placement)
    return {
        workload: tuple(sorted(found, key=lambda placement: placement.task))
        for workload, found in placements.items()
    }


def _place_on_node(node: Node, tasks: list[RunningTask]) -> list[tuple[str, Placement]]:
    _check_cpu_and_memory(node, tasks)
    placed: list[tuple[str, Placement]] = []
    next_device = 0

    def take_device(task: RunningTask, count: int) -> tuple[int, ...]:
        nonlocal next_device
        if next_device + count > node.gpus:
            raise FieldError(
                task.path,
                f"{node.name} has only {node.gpus} GPUs; the running tasks listed up to "
                f"{task.workload} (task {task.task}) need more",
            )
        devices = tuple(range(next_device, next_device + count))
        next_device += count
        return devices

    # Whole devices first, so that the shared devices come after them whatever the order.
    for task in tasks:
        if not task.group.fractional:
            count = int(task.group.gpu)
            devices = take_device(task, count) if count else ()
            placed.append((task.workload, Placement(task.task, node.name, devices, float(count))))

    group_device: dict[str, int] = {}
    load: dict[int, float] = defaultdict(float)
    for task in tasks:
        if not task.group.fractional:
            continue
        if task.group.gpu_memory > node.gpu_memory:
            raise FieldError(
                task.path,
                f"{task.workload} asks for {format_memory(task.group.gpu_memory)} of one GPU; "
                f"the devices of {node.name} have {format_memory(node.gpu_memory)}",
            )
        if task.gpu_group is None:
            device = take_device(task, 1)[0]
        elif task.gpu_group in group_device:
            device = group_device[task.gpu_group]
        else:
            device = group_device[task.gpu_group] = take_device(task, 1)[0]
        amount = task.group.gpu_on(node)
        load[device] += amount
        if load[device] > 1 + EPSILON:
            raise FieldError(
                task.gpu_group_path,
                f"gpu_group {task.gpu_group} would put {format_gpus(load[device])} GPUs "
                f"on one device of {node.name}",
            )
        placed.append((task.workload, Placement(task.task, node.name, (device,), amount)))
    return placed


def _check_cpu_and_memory(node: Node, tasks: list[RunningTask]) -> None:
    cpu = 0.0
    memory = 0
    for task in tasks:
        cpu += task.group.cpu
        memory += task.group.memory
        if cpu > node.cpu + EPSILON:
            raise FieldError(
                task.path,
                f"the running tasks on {node.name} would use {format_gpus(cpu)} CPU cores, "
                f"more than its {format_gpus(node.cpu)}",
            )
        if memory > node.memory:
            raise FieldError(
                task.path,
                f"the running tasks on {node.name} would use {format_memory(memory)} of memory, "
                f"more than its {format_memory(node.memory)}",
            )
