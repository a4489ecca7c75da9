"""Queue demands summed exactly: kept up as work comes and goes, they equal the sums made
afresh bit for bit, whatever the order (in floating point they would not)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from corral.engine.demand import Demand, add_up
from corral.engine.state import QueueState, WorkloadState
from corral.model import Queue, TaskGroup, Workload

amounts = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False)
demands = st.lists(st.tuples(amounts, amounts, amounts), max_size=30)


def workloads(queue: QueueState, requests: list[tuple[float, float, float]]) -> list[WorkloadState]:
    found = []
    for index, request in enumerate(requests):
        ws = WorkloadState(Workload(f"w{index}", queue.name, (TaskGroup(),)), queue, [])
        ws.demand = request
        found.append(ws)
    return found


def tree() -> tuple[QueueState, QueueState]:
    parent, leaf = QueueState(Queue("dept"), 0), QueueState(Queue("team", parent="dept"), 1)
    leaf.parent = parent
    parent.children.append(leaf)
    parent.path.append(parent)
    leaf.path.extend((leaf, parent))
    return parent, leaf


@given(demands, demands, st.randoms(use_true_random=False))
def test_kept_sums_equal_fresh_ones(
    kept: list[tuple[float, float, float]],
    gone: list[tuple[float, float, float]],
    rng: random.Random,
) -> None:
    parent, leaf = tree()
    staying = workloads(leaf, kept)
    leaving = workloads(leaf, gone)
    # Counted in one order, with work that then goes, taken off in another.
    mixed = staying + leaving
    rng.shuffle(mixed)
    demand = Demand(mixed)
    rng.shuffle(leaving)
    for ws in leaving:
        demand.take_off(ws)
    demand.set_requested((parent, leaf))
    kept_totals = (list(parent.requested), list(leaf.requested))

    parent.requested[:] = leaf.requested[:] = [0.0, 0.0, 0.0]
    add_up(staying, (parent, leaf))
    assert kept_totals == (parent.requested, leaf.requested)


def test_a_total_is_the_exact_sum_rounded_once() -> None:
    # 0.1 + 0.2 + 0.3 is 0.6000000000000001 added left to right; the exact sum of the three
    # floats rounds to 0.6.
    _, leaf = tree()
    demand = Demand(workloads(leaf, [(0.1, 0.0, 0.0), (0.2, 0.0, 0.0), (0.3, 0.0, 0.0)]))
    demand.set_requested((leaf,))
    assert 0.1 + 0.2 + 0.3 != 0.6
    assert leaf.requested[0] == 0.6


def two_leaves() -> tuple[QueueState, QueueState, QueueState, QueueState]:
    parent, first = tree()
    second = QueueState(Queue("other", parent="dept"), 2)
    second.parent = parent
    parent.children.append(second)
    second.path.extend((second, parent))
    idle = QueueState(Queue("idle"), 3)
    idle.path.append(idle)
    return parent, first, second, idle


@given(st.lists(st.tuples(st.booleans(), demands, st.integers(0, 30)), min_size=1, max_size=6))
def test_totals_set_cycle_after_cycle_equal_fresh_ones(
    rounds: list[tuple[bool, list[tuple[float, float, float]], int]],
) -> None:
    # A kept Demand sets again only the queues whose sums changed (the leaf and its
    # ancestors); after every cycle each queue's total is what adding up afresh gives,
    # the queues left alone included, and it says whether any total moved (always, the
    # first time).
    queues = two_leaves()
    _, first, second, _ = queues
    demand = Demand([])
    counted: list[WorkloadState] = []
    previous: list[list[float]] | None = None
    for on_second, added, leaving in rounds:
        for ws in workloads(second if on_second else first, added):
            demand.count(ws)
            counted.append(ws)
        for ws in counted[:leaving]:
            demand.take_off(ws)
        del counted[:leaving]
        moved = demand.set_requested(queues)
        kept_totals = [list(queue.requested) for queue in queues]
        assert moved == (previous is None or kept_totals != previous)
        previous = kept_totals
        for queue in queues:
            queue.requested[:] = [0.0, 0.0, 0.0]
        add_up(counted, queues)
        assert kept_totals == [queue.requested for queue in queues]


def test_the_first_setting_sets_every_queue() -> None:
    # Whatever a queue held before (a state kept from a cycle whose totals were added up
    # afresh), a new Demand's first setting gives every queue its total, 0 without work.
    parent, first, second, idle = queues = two_leaves()
    for queue in queues:
        queue.requested[:] = [5.0, 5.0, 5.0]
    demand = Demand(workloads(first, [(1.0, 2.0, 3.0)]))
    demand.set_requested(queues)
    assert parent.requested == first.requested == [1.0, 2.0, 3.0]
    assert second.requested == idle.requested == [0.0, 0.0, 0.0]
