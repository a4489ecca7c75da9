"""The engine pauses Python's cycle collector while a cycle runs, and only then; what a
cycle makes is freed by reference counting."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from corral.engine import schedule
from corral.engine.cycle import collector_paused
from corral.model import Node, Placement, Queue, Snapshot, TaskGroup, Workload, gpu_quota


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_during_a_cycle_and_on_again_after_it() -> None:
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # a pool's cycle inside a cycle
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_failing_cycle_turns_it_on_again() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the cycle failed")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_program_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_cycles_in_two_threads_share_one_pause() -> None:
    # The first cycle ends while the second still runs: the collector stays off until
    # the last one ends.
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with collector_paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with collector_paused():
            second_in.set()
            first_out.wait(5)
            seen.append(gc.isenabled())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [False]
    assert gc.isenabled()


def garbage_after_a_cycle(workloads: int) -> int:
    """Objects that only the cycle collector frees after one cycle over `workloads`
    pending single-GPU workloads (and as many running ones)."""
    nodes = tuple(Node(f"n{i}", gpus=8) for i in range(workloads // 4))
    queues = (Queue("a", deserved=gpu_quota(workloads)), Queue("b", deserved=gpu_quota(8)))
    group = (TaskGroup(gpu=1),)
    running = tuple(
        Workload(
            f"r{i}",
            "b",
            group,
            submitted=float(i),
            placements=(Placement(0, f"n{i // 8}", (i % 8,), 1.0),),
        )
        for i in range(workloads)
    )
    pending = tuple(Workload(f"p{i}", "a", group, submitted=1e6 + i) for i in range(workloads))
    snapshot = Snapshot(nodes, queues, running + pending)
    gc.collect()
    gc.disable()
    try:
        schedule(snapshot)
        return gc.collect()
    finally:
        gc.enable()


def test_a_cycle_leaves_its_work_to_reference_counting() -> None:
    # What a cycle makes per workload is freed as soon as the cycle ends; only the queue
    # tree (parents and children refer to each other) is left to the collector, so the
    # collector's pass after a cycle does not grow with the work.
    assert garbage_after_a_cycle(800) == garbage_after_a_cycle(80)
