"""One rule for a task that fits no node (engine.admission.too_big), worded twice: the
server's refusal at submit and the scheduler's pending reason. Where the two once
disagreed, both now say never."""

from __future__ import annotations

import math

from corral.engine import schedule
from corral.engine.admission import Largest, never_fits, too_big
from corral.model import Node, Queue, Resources, Snapshot, TaskGroup, Workload
from corral.model.spec import WorkloadSpec

GIB = 1024**3
TEAM = Queue("team", deserved=Resources(4, math.inf, math.inf))


def pending_reason(nodes: tuple[Node, ...], group: TaskGroup) -> str:
    workload = Workload("w", "team", (group,), submitted=0)
    return schedule(Snapshot(nodes, (TEAM,), (workload,))).pending["w"]


def refusal(nodes: tuple[Node, ...], group: TaskGroup) -> object:
    return never_fits(WorkloadSpec("w", "team", "u", (group,)), nodes, (TEAM,))


def test_a_fraction_on_a_cluster_without_gpus_never_fits_for_both() -> None:
    # The scheduler used to leave it waiting for a device to free ("no device has 0.5 GPU
    # free"), where the server refused it.
    nodes = (Node("cpu-only", gpus=0, cpu=32),)
    fraction = TaskGroup(gpu=0.5)
    assert refusal(nodes, fraction) == (("tasks", 0, "gpu"), "no node has a GPU")
    assert pending_reason(nodes, fraction) == (
        "each task needs 0.5 GPU but the largest node has 0 GPUs"
    )


def test_device_memory_is_that_of_nodes_with_gpus_for_both() -> None:
    # A node without GPUs has no device, whatever memory it states for one: the scheduler
    # used to count it, where the server did not.
    nodes = (Node("gpu", gpus=1, gpu_memory=40 * GIB), Node("cpu", gpus=0, gpu_memory=80 * GIB))
    large = TaskGroup(gpu_memory=60 * GIB)
    assert refusal(nodes, large) == (
        ("tasks", 0, "gpu_memory"),
        "no GPU has 60GiB of memory; the largest has 40GiB",
    )
    assert pending_reason(nodes, large) == (
        "each task needs 60GiB of GPU memory but the largest device has 40GiB"
    )


def test_the_rule_names_the_first_resource_too_large() -> None:
    largest = Largest(gpus=4, gpu_memory=80 * GIB, cpu=64.0, memory=512 * GIB)
    assert too_big(TaskGroup(gpu=8), largest) == "gpu"
    assert too_big(TaskGroup(gpu=4, cpu=128), largest) == "cpu"
    assert too_big(TaskGroup(gpu_memory=100 * GIB), largest) == "gpu_memory"
    assert too_big(TaskGroup(memory=1024 * GIB), largest) == "memory"
    assert too_big(TaskGroup(gpu=4, cpu=64, memory=512 * GIB), largest) is None
    assert Largest.of([]) is None
