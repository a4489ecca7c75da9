"""One rule for a task that fits no node (engine.admission.too_big), worded twice: the
server's refusal at submit and the scheduler's pending reason. Where the two once
disagreed, both now say never."""

from __future__ import annotations

import math
from dataclasses import replace

from corral.engine import schedule
from corral.engine.admission import Largest, never_fits, too_big
from corral.model import Node, PoolQuota, Queue, Resources, Snapshot, TaskGroup, Workload
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


def test_a_workload_with_pools_is_judged_on_their_nodes_for_both() -> None:
    # 8 GPUs exist, but not in a100: the server used to accept it to wait for ever.
    nodes = (
        Node("a", gpus=4, labels={"pool": "a100"}),
        Node("h", gpus=8, labels={"pool": "h100"}),
    )
    eight = TaskGroup(gpu=8)
    only_a100 = WorkloadSpec("w", "team", "u", (eight,), node_pools=("a100",))
    assert never_fits(only_a100, nodes, (TEAM,)) == (
        ("tasks", 0, "gpu"),
        "no node of pool a100 has 8 GPUs; the largest has 4",
    )
    workload = Workload("w", "team", (eight,), submitted=0, node_pools=("a100",))
    assert schedule(Snapshot(nodes, (TEAM,), (workload,))).pending["w"] == (
        "pool a100: each task needs 8 GPUs but the largest node has 4 GPUs"
    )
    # Another of its pools holds it; a pool without nodes may get some.
    for pools in (("a100", "h100"), ("a100", "b200"), ("b200",)):
        assert never_fits(replace(only_a100, node_pools=pools), nodes, (TEAM,)) is None


def test_pools_are_named_together_where_that_holds_else_one_by_one() -> None:
    nodes = tuple(
        Node(f"{pool}-{i}", gpus=gpus, cpu=cpu, labels={"pool": pool})
        for pool, gpus, cpu in (("a", 4, 64), ("b", 4, 64), ("c", 2, 128))
        for i in range(2)
    )
    team = replace(TEAM, pools={"c": PoolQuota(limit=Resources(2, math.inf, math.inf))})

    def refusal(group: TaskGroup, *pools: str) -> object:
        spec = WorkloadSpec("w", "team", "u", (group,), node_pools=pools)
        return never_fits(spec, nodes, (team,))

    assert refusal(TaskGroup(gpu=8), "a", "b", "c") == (
        ("tasks", 0, "gpu"),
        "no node of pool a, b or c has 8 GPUs; the largest has 4",
    )
    # 16 GPUs in a and b together, 8 in each: a gang runs in one pool.
    assert refusal(TaskGroup(replicas=3, gpu=4), "a", "b") == (
        ("tasks",),
        "pool a: the gang needs 12 GPUs at once (3 tasks); all the nodes of the pool have "
        "8 GPUs together; pool b: the gang needs 12 GPUs at once (3 tasks); all the nodes of "
        "the pool have 8 GPUs together",
    )
    assert refusal(TaskGroup(gpu=4), "c") == (
        ("tasks",),
        "it needs 4 GPUs at once, more than project team's limit of 2 GPUs in pool c",
    )
    # Different fields in each pool: the part of the path they share.
    assert refusal(TaskGroup(replicas=3, gpu=1, cpu=100), "a", "c") == (
        ("tasks",),
        "pool a: no node of the pool has 100 CPU cores; the largest has 64; pool c: it needs "
        "3 GPUs at once, more than project team's limit of 2 GPUs",
    )
    # Its own limit holds in the default pool only.
    capped = replace(TEAM, limit=Resources(1, math.inf, math.inf))
    spec = WorkloadSpec("w", "team", "u", (TaskGroup(gpu=4),), node_pools=("a",))
    assert never_fits(spec, nodes, (capped,)) is None
