"""Time-decayed fair share in the simulator: the usage history on the virtual clock, the
shortcuts changing nothing with it on, and a flood that costs the flooder later."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.engine.quiet import CycleGate
from corral.model import Node, Queue, TaskGroup
from corral.model.usage import DecayedUsage, advance
from corral.sim import (
    Cluster,
    Job,
    SimSettings,
    Simulation,
    Trace,
    prepare,
    project_queues,
    simulator,
    synthetic_trace,
    uniform_nodes,
)
from corral.sim.usage import UsageHistory

HOUR = 3600.0


def _with_half_life(queues: tuple[Queue, ...], half_life: float) -> tuple[Queue, ...]:
    return tuple(replace(queue, fair_share_half_life=half_life) for queue in queues)


def test_history_follows_what_is_held() -> None:
    queues = _with_half_life(project_queues({"a": 2.0, "b": 2.0}), HOUR)
    history = UsageHistory(queues)
    history.change("a", 3.0, 0.0)
    history.change("b", 1.0, 1800.0)
    history.change("a", -3.0, 7200.0)
    shares = history.shares(9000.0)
    # The same by hand, interval by interval.
    a = advance(DecayedUsage(), 3.0, 3.0, 1800.0, HOUR)
    a = advance(a, 3.0, 4.0, 5400.0, HOUR)
    a = advance(a, 0.0, 1.0, 1800.0, HOUR)
    assert shares["a"] == pytest.approx(a.share)
    assert shares["a"] + shares["b"] == pytest.approx(1.0)


def test_history_is_off_without_a_half_life() -> None:
    history = UsageHistory(project_queues({"a": 2.0}))
    history.change("a", 3.0, 0.0)
    assert not history.on and history.shares(100.0) == {}


def test_shortcuts_change_nothing_with_time_decay(monkeypatch: pytest.MonkeyPatch) -> None:
    """With usage moving the fair shares, skipping quiet cycles still changes nothing."""
    monkeypatch.setattr(simulator, "_SHOWN_PER_QUEUE", 3)
    trace = synthetic_trace(seed=2).head(220)
    quotas = {"team-a": 8.0, "team-b": 6.0, "team-c": 6.0, "team-d": 4.0}
    queues = _with_half_life(project_queues(quotas), 2 * HOUR)
    cluster = Cluster("tight", uniform_nodes(24), queues)
    outcomes = []
    for shortcuts in (True, False):
        simulation = Simulation(
            prepare("corral", cluster), trace, quotas, SimSettings(shortcuts=shortcuts)
        )
        simulation.run()
        outcomes.append(
            [(s.first_start, s.end, s.preemptions, s.workload.placements) for s in simulation.jobs]
        )
    assert outcomes[0] == outcomes[1]


def _flood(half_life: float | None) -> float:
    """GPU-hours the flooder holds in the 12 hours after the others arrive."""
    jobs = [Job(f"f{i}", "flood", 0.0, 6 * HOUR, (TaskGroup(gpu=1.0),)) for i in range(8)] + [
        Job(f"{team}{i}", team, 6 * HOUR + i, 3 * HOUR, (TaskGroup(gpu=1.0),))
        for team in ("flood", "other")
        for i in range(32)
    ]
    trace = Trace("flood", "test", tuple(jobs), 18 * HOUR)
    queues = project_queues({"flood": 0.0, "other": 0.0})
    if half_life is not None:
        queues = _with_half_life(queues, half_life)
    cluster = Cluster("c", (Node("node0", gpus=8),), queues)
    held = []
    for horizon in (6 * HOUR, 18 * HOUR):
        settings = SimSettings(cycle_interval=60.0, horizon=horizon)
        result = Simulation(prepare("corral", cluster), trace, {}, settings).run()
        held.append(result.by_project["flood"].gpu_hours)
    return held[1] - held[0]


def test_a_flood_costs_the_flooder_later() -> None:
    off, on = _flood(None), _flood(6 * HOUR)
    # Equal weights: without the policy the two split the 96 GPU-hours about evenly.
    assert off == pytest.approx(48.0, abs=6.0)
    assert on < off - 10.0


def test_the_gate_divides_with_the_usage() -> None:
    """Each queue holds its even share of 8 GPUs and b waits for one more: no reclaim by
    weight alone, but once a's heavy usage lowers its weight, b may reclaim, so the
    gate must not skip the cycle."""
    queues = _with_half_life(project_queues({"a": 0.0, "b": 0.0}), HOUR)
    gate = CycleGate(uniform_nodes(8), queues, ("allocate", "reclaim"))
    one = (1.0, 0.0, 0.0)
    for i in range(4):
        for name in ("a", "b"):
            order = (-50, float(i), f"{name}{i}")
            gate.arrived(name, (1.0, 50, True), one, order, True)
            gate.started(name, (1.0, 50, True), one, one, order, True)
    gate.arrived("b", (1.0, 50, True), one, (-50, 9.0, "b9"), True)
    assert not gate.may_change()
    gate.set_usage({"a": 0.9, "b": 0.1})
    assert gate.may_change()
