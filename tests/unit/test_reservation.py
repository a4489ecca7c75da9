"""Backfill reservations in the engine (engine.reservation): who reserves, which nodes,
when they are expected free, and what may backfill them."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from corral.engine import Scheduler, apply_decisions, schedule
from corral.model import Node, Placement, Queue, Resources, Snapshot, TaskGroup, Workload
from corral.scenario import check_expectations, load_scenario, plan

SCENARIOS = Path(__file__).parent.parent / "scenarios"


def _queue(name: str, gpus: float, **fields: object) -> Queue:
    return replace(Queue(name, deserved=Resources(gpus, math.inf, math.inf)), **fields)  # type: ignore[arg-type]


def _job(name: str, queue: str, gpus: int, at: int, **fields: object) -> Workload:
    # Non-preemptible: nothing is reclaimed for the gang, which must wait for room.
    job = Workload(
        name, queue, (TaskGroup(gpu=float(gpus)),), priority=100, preemptible=False, submitted=at
    )
    return replace(job, **fields)  # type: ignore[arg-type]


def _running(name: str, node: str, device: int, left: float | None) -> Workload:
    """A 1-GPU job on `node` whose max runtime ends `left` seconds from now."""
    job = _job(name, "other", 1, 0, placements=(Placement(0, node, (device,), 1.0),))
    if left is None:
        return job
    return replace(job, max_runtime=3600.0 + left, running_for=3600.0)


def _cluster(ends: list[float | None], *pending: Workload, reserve: float | None) -> Snapshot:
    """Nodes of 2 GPUs, each with one running job ending as `ends` says."""
    nodes = tuple(Node(f"n{index}", gpus=2) for index in range(len(ends)))
    queues = (
        _queue("big", 4, reserve_after=reserve, priority=200),
        _queue("small", 4),
        _queue("other", 8),
    )
    running = tuple(_running(f"r{index}", f"n{index}", 0, end) for index, end in enumerate(ends))
    return Snapshot(nodes, queues, running + pending)


GANG = _job("gang", "big", 2, 10, waiting_for=7200.0)


def test_reserves_the_node_that_drains_first_and_says_when() -> None:
    snapshot = _cluster([3000.0, 600.0, 9000.0], GANG, reserve=3600.0)
    decisions = schedule(snapshot)
    held = decisions.reservations["gang"]
    assert (held.nodes, held.starts_in) == (("n1",), 600.0)
    assert decisions.pending["gang"].endswith("reserved nodes n1 from ~10m from now")


def test_off_by_default_and_not_before_the_wait() -> None:
    for reserve, waited in ((None, 7200.0), (3600.0, 1800.0), (3600.0, None)):
        gang = replace(GANG, waiting_for=waited)
        decisions = schedule(_cluster([3000.0, 600.0], gang, reserve=reserve))
        assert decisions.reservations == {}
        assert "reserved" not in decisions.pending["gang"]


@pytest.mark.parametrize(
    ("max_runtime", "backfills"),
    # Ends before the reservation starts (10 minutes): backfills the reserved node; ends
    # after it, or never: kept off it.
    [(300.0, True), (600.0, True), (601.0, False), (None, False)],
)
def test_only_work_that_ends_before_the_start_backfills(
    max_runtime: float | None, backfills: bool
) -> None:
    snapshot = _cluster([3000.0, 600.0], GANG, reserve=3600.0)
    # n0 is full, so the reserved n1 has the only free GPU.
    full = _running("r0b", "n0", 1, 3000.0)
    small = _job("small", "small", 1, 20, max_runtime=max_runtime)
    snapshot = replace(snapshot, workloads=(*snapshot.workloads, full, small))
    decisions = schedule(snapshot)
    assert decisions.reservations["gang"].nodes == ("n1",)
    if backfills:
        assert [p.node for p in decisions.bindings["small"]] == ["n1"]
    else:
        assert "small" not in decisions.bindings
        assert decisions.pending["small"].endswith("reserved for gang: n1")


def test_unknown_ends_come_last_and_leave_no_start() -> None:
    decisions = schedule(_cluster([None, 7200.0], GANG, reserve=3600.0))
    assert decisions.reservations["gang"].nodes == ("n1",)
    decisions = schedule(_cluster([None, None], GANG, reserve=3600.0))
    held = decisions.reservations["gang"]
    assert held.starts_in is None
    assert "when work with no max runtime ends" in decisions.pending["gang"]


def test_work_that_overran_its_max_runtime_is_due_now() -> None:
    snapshot = _cluster([3000.0, 600.0], GANG, reserve=3600.0)
    late = replace(snapshot.workloads[0], running_for=99999.0)
    snapshot = replace(snapshot, workloads=(late, *snapshot.workloads[1:]))
    held = schedule(snapshot).reservations["gang"]
    assert (held.nodes, held.starts_in) == (("n0",), 0.0)


def test_the_longest_waiting_head_reserves_first_one_head_per_queue() -> None:
    second = _job("second", "small", 2, 11, waiting_for=9000.0)
    behind = _job("behind", "big", 2, 12, waiting_for=99999.0)
    queues = tuple(
        replace(queue, reserve_after=3600.0) if queue.name == "small" else queue
        for queue in _cluster([], reserve=3600.0).queues
    )
    snapshot = replace(
        _cluster([3000.0, 600.0], GANG, second, behind, reserve=3600.0), queues=queues
    )
    reservations = schedule(snapshot).reservations
    # `second` waited longer than `gang` (the head of big; `behind` is not a head).
    assert reservations["second"].nodes == ("n1",)
    assert reservations["gang"].nodes == ("n0",)
    assert "behind" not in reservations


def test_a_gang_too_big_for_any_node_or_over_its_limit_reserves_nothing() -> None:
    huge = replace(GANG, task_groups=(TaskGroup(gpu=4.0),))
    assert schedule(_cluster([3000.0], huge, reserve=3600.0)).reservations == {}
    snapshot = _cluster([3000.0], GANG, reserve=3600.0)
    limited = tuple(
        replace(queue, limit=Resources(1.0, math.inf, math.inf)) if queue.name == "big" else queue
        for queue in snapshot.queues
    )
    assert schedule(replace(snapshot, queues=limited)).reservations == {}


def test_the_kept_state_decides_as_a_fresh_cycle() -> None:
    scheduler = Scheduler()
    for name in ("C90-backfill-reservation", "C92-reservation-unknown-end"):
        scenario = load_scenario(SCENARIOS / f"{name}.yaml")
        snapshot = scenario.snapshot
        for _ in range(3):
            decisions = scheduler(snapshot, scenario.config)
            assert decisions == schedule(snapshot, scenario.config)
            snapshot = apply_decisions(snapshot, decisions)


def test_expected_reservations_are_checked() -> None:
    scenario = load_scenario(SCENARIOS / "C90-backfill-reservation.yaml")
    assert scenario.expectations is not None
    result = plan(scenario)
    assert result.to_json()["reservations"] == {"big": {"nodes": ["node0"], "starts_in": 1200.0}}
    wrong = replace(scenario.expectations, reserved={"big": ("node1",), "small-long": ("node0",)})
    assert check_expectations(replace(scenario, expectations=wrong), result) == [
        "big: expected a reservation of [node1], but it holds [node0]",
        "small-long: expected a reservation of [node0], but it has none",
    ]
