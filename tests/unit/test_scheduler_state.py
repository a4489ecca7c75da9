"""engine.Scheduler keeps the state of running work between cycles; these pin what it
does with input it must refuse, that a refused cycle leaves nothing behind, and that
fair shares kept from the last cycle are divided again when what they depend on moves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.engine import Scheduler, apply_decisions, schedule
from corral.model import Node, Placement, Queue, Snapshot, TaskGroup, Workload


def cluster() -> Snapshot:
    nodes = (Node("n1", gpus=4), Node("n2", gpus=4))
    queues = (Queue("a"), Queue("b"))
    workloads = tuple(
        Workload(f"w{i}", "a" if i % 2 else "b", (TaskGroup(gpu=2.0),), submitted=float(i))
        for i in range(5)
    )
    return Snapshot(nodes, queues, workloads)


def test_a_refused_cycle_leaves_no_state_behind() -> None:
    scheduler = Scheduler()
    first = cluster()
    after = apply_decisions(first, scheduler(first))
    running = [w for w in after.workloads if w.placements]
    assert len(running) == 4
    # Loaded in submission order: `extra` is taken into the state before `lost` is refused.
    extra = Workload(
        "extra", "a", (TaskGroup(gpu=1.0),), submitted=50.0,
        placements=(Placement(0, "n1", (3,), 1.0),),
    )  # fmt: skip
    lost = Workload(
        "lost", "a", (TaskGroup(gpu=1.0),), submitted=99.0,
        placements=(Placement(0, "n9", (0,), 1.0),),
    )  # fmt: skip
    with pytest.raises(ValueError, match="workload lost: unknown node 'n9'"):
        scheduler(replace(after, workloads=(*after.workloads, extra, lost)))
    # The next cycle starts afresh: what the refused one loaded is gone.
    ended = replace(after, workloads=tuple(w for w in after.workloads if w is not running[0]))
    assert scheduler(ended) == schedule(ended)


def test_a_workload_listed_twice_is_refused() -> None:
    snapshot = cluster()
    twice = replace(snapshot, workloads=(*snapshot.workloads, snapshot.workloads[0]))
    with pytest.raises(ValueError, match="workload w0: listed twice"):
        schedule(twice)
    with pytest.raises(ValueError, match="workload w0: listed twice"):
        Scheduler()(twice)


def test_a_kept_scheduler_refuses_a_workload_listed_twice() -> None:
    """A Scheduler with kept state learns what changed from the workloads' identities: a
    workload given again beside itself, as the same object or as an equal new one, is
    refused as it is afresh, and the next cycle starts afresh."""
    scheduler = Scheduler()
    first = cluster()
    after = apply_decisions(first, scheduler(first))
    for again in (after.workloads[0], replace(after.workloads[0]), after.workloads[-1]):
        twice = replace(after, workloads=(*after.workloads, again))
        with pytest.raises(ValueError, match=f"workload {again.name}: listed twice"):
            scheduler(twice)
        assert scheduler(after) == schedule(after)


def test_decisions_that_were_not_applied_are_decided_again() -> None:
    """A caller may not write a cycle's decisions (the server's cycle lost a race with
    another write): the next snapshot gives the same workloads, the very same objects,
    and the kept state must not take the bindings it only decided as done."""
    scheduler = Scheduler()
    snapshot = cluster()
    decisions = scheduler(snapshot)
    assert len(decisions.bindings) == 4
    again = scheduler(snapshot)
    assert again == schedule(snapshot) == decisions


def test_kept_fair_shares_are_divided_again_when_only_the_usage_moved() -> None:
    """No queue's request changes from one cycle to the next, only the usage that
    time-decayed fair share weighs: the shares move with it, as a fresh cycle divides
    them, and stay as they are while nothing moves."""
    nodes = (Node("n1", gpus=8),)
    queues = (Queue("a", fair_share_half_life=3600.0), Queue("b", fair_share_half_life=3600.0))
    workloads = tuple(
        Workload(f"{queue}{i}", queue, (TaskGroup(gpu=1.0),), submitted=float(i))
        for queue in "ab"
        for i in range(8)
    )
    scheduler = Scheduler()
    snapshot = Snapshot(nodes, queues, workloads, usage={"a": 0.9, "b": 0.1})
    shares = []
    # The usage of each cycle after the first: kept, then swapped, then kept again.
    for usage in ({"a": 0.9, "b": 0.1}, {"a": 0.1, "b": 0.9}, {"a": 0.1, "b": 0.9}, None):
        decisions = scheduler(snapshot)
        assert decisions == schedule(snapshot)
        shares.append(tuple(decisions.queues[name].fair_share.gpu for name in "ab"))
        if usage is not None:
            snapshot = replace(apply_decisions(snapshot, decisions), usage=usage)
    low, high = shares[0]
    assert low < high
    assert shares == [(low, high), (low, high), (high, low), (high, low)]
