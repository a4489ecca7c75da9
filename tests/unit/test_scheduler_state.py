"""engine.Scheduler keeps the state of running work between cycles; these pin what it
does with input it must refuse, and that a refused cycle leaves nothing behind."""

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
