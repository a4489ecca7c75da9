"""Placement scorers, the scorer-driven scheduler, and the fragmentation protocol."""

from __future__ import annotations

import random

import numpy as np
import pytest

from corral.engine import apply_decisions, schedule
from corral.model import (
    Node,
    Placement,
    Queue,
    SchedulerConfig,
    Snapshot,
    TaskGroup,
    Workload,
    gpu_quota,
)
from corral.sim.fragmentation import run_fragmentation, sample_pods
from corral.sim.loaders import Pod
from corral.sim.packing import (
    SCORERS,
    FragmentationGradient,
    PackingState,
    ScorerScheduler,
    place_group,
)

ONE_GPU = TaskGroup(gpu=1.0, cpu=4.0)


def cluster() -> PackingState:
    """a: 4 GPUs / 16 cores, one task on 3 GPUs and 4 cores; b: 4 GPUs / 64 cores, one on
    1 GPU and 4 cores; c: 8 GPUs / 64 cores, idle."""
    state = PackingState(
        [Node("a", gpus=4, cpu=16), Node("b", gpus=4, cpu=64), Node("c", gpus=8, cpu=64)]
    )
    for node, devices in (("a", (0, 1, 2)), ("b", (0,))):
        state.bind(Placement(0, node, devices, float(len(devices))), ONE_GPU, 1.0)
    return state


def choose(policy: str, group: TaskGroup, state: PackingState | None = None) -> str:
    state = state or cluster()
    fits = state.fits(group, state.eligible(()))
    node, _ = SCORERS[policy](state, group, fits)
    return state.nodes[node].name


def test_bestfit_takes_the_node_left_fullest() -> None:
    # Left after the task, as shares: a 0 GPU, 8/16 CPU, all memory (1.5); b 2/4, 56/64
    # and all memory (2.4); c more.
    assert choose("bestfit", ONE_GPU) == "a"


def test_packing_prefers_the_busiest_node_in_use() -> None:
    assert choose("packing", ONE_GPU) == "a"
    # A task needing 2 GPUs fits only on b (in use) and c (idle): b.
    assert choose("packing", TaskGroup(gpu=2.0)) == "b"


def test_dotprod_aligns_request_with_free_capacity() -> None:
    # Request and free capacity as shares of each node, (GPU, CPU): on a, (1/4, 4/16) and
    # (1/4, 12/16), dot 0.25; on b, (1/4, 4/64) and (3/4, 60/64), dot 0.246; on c, (1/8,
    # 4/64) and (1, 1), dot 0.1875. a is best aligned.
    assert choose("dotprod", TaskGroup(gpu=1.0, cpu=4.0)) == "a"
    # Without CPU in the request, b's free GPU share wins: 0.1875 against 0.0625 and 0.125.
    assert choose("dotprod", TaskGroup(gpu=1.0)) == "b"


def test_random_only_picks_nodes_where_the_task_fits() -> None:
    state = cluster()
    state.rng = np.random.default_rng(5)
    picks = {choose("random", TaskGroup(gpu=4.0), state) for _ in range(20)}
    assert picks == {"c"}


def test_fractions_go_to_the_fullest_device_with_room() -> None:
    state = PackingState([Node("n", gpus=2)])
    state.bind(Placement(0, "n", (0,), 0.5), TaskGroup(gpu=0.5), 1.0)
    state.bind(Placement(0, "n", (1,), 0.3), TaskGroup(gpu=0.3), 1.0)
    placement = state.place(TaskGroup(gpu=0.4), 0, 0)
    assert placement.devices == (0,)  # 0.5 free on device 0 is tighter than 0.7 on device 1
    assert state.best_free[0] == pytest.approx(0.7)


def test_fragmentation_gradient_keeps_room_for_the_common_kind() -> None:
    """Every task of the workload asks for half a GPU. Device 0 is 0.4 used: a 0.2 task on
    it would leave 0.4 free, too little for the common kind (fragmentation +0.4); on device
    1 it leaves 0.8 (no fragmentation). Best fit would take the fuller device 0."""
    state = PackingState([Node("n", gpus=2)])
    state.bind(Placement(0, "n", (0,), 0.4), TaskGroup(gpu=0.4), 1.0)
    task = TaskGroup(gpu=0.2)
    fits = state.fits(task, state.eligible(()))
    scorer = FragmentationGradient.of([TaskGroup(gpu=0.5)] * 9 + [task])
    assert scorer(state, task, fits) == (0, 1)
    assert state.place(task, 0, *SCORERS["bestfit"](state, task, fits)).devices == (0,)
    # For a 1-GPU kind, partly used devices are fragments; all free capacity is when no
    # device is wholly free, or when the node lacks the CPU the kind needs.
    whole = FragmentationGradient([(4.0, 1.0)], [1.0])
    free = np.array([[0.6, 1.0], [0.6, 0.0], [0.6, 1.0]])
    cpu = np.array([8.0, 8.0, 2.0])
    assert whole.fragmentation(free, cpu).tolist() == pytest.approx([0.6, 0.6, 1.6])


def test_a_gang_is_placed_whole_or_not_at_all() -> None:
    state = cluster()
    before = (state.used.copy(), state.free_cpu.copy())
    # Two tasks of 8 GPUs: only c has 8 free, so the second fails and the first is undone.
    assert place_group(state, SCORERS["bestfit"], (TaskGroup(replicas=2, gpu=8.0),), ()) is None
    assert np.array_equal(state.used, before[0]) and np.array_equal(state.free_cpu, before[1])


def test_scorer_scheduler_serves_oldest_first() -> None:
    nodes = (Node("n0", gpus=2), Node("n1", gpus=2))
    queue = (Queue("pool", deserved=gpu_quota(4)),)
    workloads = (
        Workload("late", "pool", (TaskGroup(gpu=2.0),), submitted=5.0),
        Workload("early", "pool", (TaskGroup(gpu=2.0),), submitted=1.0),
        Workload("big", "pool", (TaskGroup(gpu=4.0),), submitted=0.0),
        Workload(
            "busy",
            "pool",
            (TaskGroup(gpu=1.0),),
            submitted=0.0,
            placements=(Placement(0, "n0", (0,), 1.0),),
        ),
    )
    decisions = ScorerScheduler(SCORERS["bestfit"])(
        Snapshot(nodes, queue, workloads), SchedulerConfig()
    )
    assert set(decisions.bindings) == {"early"}
    assert decisions.bindings["early"][0].node == "n1"
    assert set(decisions.pending) == {"late", "big"}


def test_sampling_reaches_130_percent() -> None:
    pods = [Pod(f"p{i}", 1.0, 0, 1, 1000) for i in range(5)] + [Pod("cpu", 2.0, 0, 0, 0)]
    sampled = sample_pods(pods, capacity=100.0, seed=42)
    total = sum(pod.gpu for pod in sampled)
    assert total == 130.0  # 1-GPU pods: the draw stops on reaching 130% exactly
    assert any(pod.name == "cpu" for pod in sampled)
    assert sampled != sample_pods(pods, capacity=100.0, seed=43)


def test_unallocated_share_at_full_arrival() -> None:
    # Two nodes of 2 GPUs. p0 (2 GPUs) takes n0; f0 (0.6) and f1 (0.9) share n1's two
    # devices; f2 (0.5) finds 0.4 and 0.1 free there and fails.
    nodes = [Node("n0", gpus=2), Node("n1", gpus=2)]
    pods = [
        Pod("p0", 1.0, 0, 2, 1000),
        Pod("f0", 1.0, 0, 1, 600),
        Pod("f1", 1.0, 0, 1, 900),
        Pod("f2", 1.0, 0, 1, 500),
    ]
    run = run_fragmentation(nodes, pods, "bestfit")
    assert run.arrived.tolist() == pytest.approx([2.0, 2.6, 3.5, 4.0])
    assert run.allocated.tolist() == pytest.approx([2.0, 2.6, 3.5, 3.5])
    # Arrived demand reaches 100% (4 GPUs) at the last pod: 0.5 of 4 GPUs unallocated.
    assert run.unallocated_at(1.0) == pytest.approx(0.5 / 4)
    # Half of capacity arrived with the first pod, which took it: half is unallocated.
    assert run.unallocated_at(0.5) == 0.5


def test_engine_policy_is_the_one_by_one_protocol() -> None:
    """One engine cycle over all pods places them exactly as one cycle per pod would."""
    rng = random.Random(7)
    nodes = [
        Node(f"n{i}", gpus=rng.choice((2, 4, 8)), cpu=32, gpu_model=rng.choice(("T4", "V100")))
        for i in range(6)
    ]
    pods = [
        Pod(
            f"p{i}",
            float(rng.choice((2, 4, 8))),
            0,
            gpus := rng.choice((0, 1, 1, 1, 2, 4)),
            rng.choice((250, 500, 1000)) if gpus == 1 else 1000,
            (rng.choice(("T4", "V100")),) if rng.random() < 0.3 else (),
        )
        for i in range(40)
    ]
    together = run_fragmentation(nodes, pods, "corral")
    snapshot = Snapshot(tuple(nodes), (Queue("pool", deserved=gpu_quota(10**6)),), ())
    config = SchedulerConfig(actions=("allocate",))
    placed = []
    for index, pod in enumerate(pods):
        workload = Workload(
            f"pod{index:06d}",
            "pool",
            (pod.task_group(),),
            node_selector={"gpu_model": pod.gpu_models} if pod.gpu_models else {},
            submitted=float(index),
        )
        snapshot = Snapshot(snapshot.nodes, snapshot.queues, (*snapshot.workloads, workload))
        decisions = schedule(snapshot, config)
        placed.append(pod.gpu if workload.name in decisions.bindings else 0.0)
        snapshot = apply_decisions(snapshot, decisions)
    assert together.allocated.tolist() == pytest.approx(np.cumsum(placed).tolist())
