"""The event loop: a hand-computed timeline with one preemption, coalescing of events
into cycles, idle clocks, and the shortcuts changing nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.model import Node, TaskGroup
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


def job(name: str, project: str, submitted: float, duration: float, gpus: int) -> Job:
    return Job(name, project, submitted, duration, (TaskGroup(gpu=float(gpus)),))


def run(
    jobs: list[Job], quotas: dict[str, float], gpus: int, settings: SimSettings, policy: str
) -> Simulation:
    trace = Trace("t", "test", tuple(jobs), max(j.submitted for j in jobs))
    cluster = Cluster("c", (Node("node0", gpus=gpus),), project_queues(quotas))
    simulation = Simulation(prepare(policy, cluster), trace, cluster.quotas(), settings)
    simulation.result = simulation.run()  # type: ignore[attr-defined]
    return simulation


THREE_JOBS = [
    job("j1", "a", 0, 3600, 2),  # borrows b's GPU
    job("j2", "b", 1000, 600, 1),  # reclaims it: j1 is evicted whole
    job("j3", "a", 1200, 300, 1),  # fits in the GPU j1 left
]


@pytest.mark.parametrize(
    ("checkpoint", "kept"),
    [(1800.0, 0.0), (600.0, 600.0), (0.0, 1000.0)],
)
def test_three_jobs_one_preemption(checkpoint: float, kept: float) -> None:
    """One node of 2 GPUs; projects a and b deserve 1 each.

    t=0     j1 (a, 2 GPUs, 1 h) starts, borrowing b's GPU.
    t=1000  j2 (b, 1 GPU) arrives; the cycle at 1000 reclaims: j1 is evicted after 1000 s
            of work, keeping what its last checkpoint saved (`kept`), and j2 starts.
    t=1200  j3 (a, 1 GPU, 300 s) starts in the free GPU; j1 (2 GPUs) still does not fit.
    t=1500  j3 ends; j1 still does not fit (cycle skipped).
    t=1600  j2 ends; j1 restarts, pays 60 s and runs its remaining 3600 - kept s.
    """
    settings = SimSettings(checkpoint_interval=checkpoint, restart_cost=60.0)
    simulation = run(THREE_JOBS, {"a": 1, "b": 1}, 2, settings, "corral")
    states = {state.job.name: state for state in simulation.jobs}
    j1, j2, j3 = states["j1"], states["j2"], states["j3"]
    assert (j1.first_start, j1.end, j1.preemptions) == (0.0, 1600 + 60 + 3600 - kept, 1)
    assert (j2.first_start, j2.end, j2.preemptions) == (1000.0, 1600.0, 0)
    assert (j3.first_start, j3.end, j3.preemptions) == (1200.0, 1500.0, 0)
    assert j1.lost == (1000 - kept) * 2  # GPU-seconds of progress thrown away
    assert j1.restarts == 60 * 2  # GPU-seconds spent restarting
    result = simulation.result  # type: ignore[attr-defined]
    assert result.preemptions == 1 and dict(result.evictions_by_action) == {"reclaim": 1}
    assert result.lost_gpu_hours == pytest.approx((1000 - kept) * 2 / 3600)
    # j1 held 2 GPUs for 1000 s and again from 1600 to its end; j2 600 s; j3 300 s.
    held = 2 * 1000 + 2 * (1600 + 60 + 3600 - kept - 1600) + 600 + 300
    assert result.gpu_hours == pytest.approx(held / 3600)
    assert result.by_project["a"].gpu_hours == pytest.approx((held - 600) / 3600)
    assert result.queueing_delay.mean == 0.0
    assert result.completion_time.mean == pytest.approx((1600 + 60 + 3600 - kept + 600 + 300) / 3)
    # Cycles ran at 0, 1000 (the reclaim), 1200 and 1600. Skipped: the follow-ups after
    # each change (10, 1010, 1210, 1610: nothing more fits) and the one j3's end asked for
    # at 1500 (one GPU free, j1 needs two).
    assert (result.cycles, result.skipped_cycles) == (4, 5)


def test_events_between_cycle_times_share_one_cycle() -> None:
    jobs = [job("x", "a", 3, 100, 1), job("y", "a", 7, 100, 1)]
    simulation = run(jobs, {"a": 2}, 2, SimSettings(), "fifo")
    assert [state.first_start for state in simulation.jobs] == [10.0, 10.0]
    assert [state.end for state in simulation.jobs] == [110.0, 110.0]
    assert simulation.result.cycles == 1  # type: ignore[attr-defined]


def test_an_idle_clock_costs_no_cycles() -> None:
    # Two jobs a month apart: a cycle for each and, after each start, a follow-up that
    # is skipped (nothing is pending); nothing in between.
    jobs = [job("x", "a", 0, 60, 1), job("y", "a", 30 * 86400, 60, 1)]
    simulation = run(jobs, {"a": 1}, 1, SimSettings(), "corral")
    result = simulation.result  # type: ignore[attr-defined]
    assert (result.cycles, result.skipped_cycles) == (2, 2)
    assert simulation.jobs[1].first_start == 30 * 86400


def test_a_job_that_never_fits_is_counted_unstarted() -> None:
    jobs = [job("x", "a", 0, 60, 4), job("y", "a", 100, 60, 1)]
    simulation = run(jobs, {"a": 1}, 2, SimSettings(), "static")
    result = simulation.result  # type: ignore[attr-defined]
    assert result.unstarted == 1 and result.completed == 1
    # Its delay counts until the simulation ends (y's end at 160): a lower bound.
    assert result.queueing_delay.p50 == pytest.approx((160 - 0 + 0) / 2)


@pytest.mark.parametrize("policy", ["corral", "static", "fifo", "bestfit"])
def test_shortcuts_change_nothing(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skipping quiet cycles and hiding pending work gives exactly the same run as
    running every cycle on every pending workload (on a tight cluster with backlogs,
    limits, reclaims and preemptions). Queues show only 3 pending workloads at first,
    so that hiding, and running a cycle again whole, both happen."""
    monkeypatch.setattr(simulator, "_SHOWN_PER_QUEUE", 3)
    trace = synthetic_trace(seed=1).head(220)
    quotas = {"team-a": 8.0, "team-b": 6.0, "team-c": 6.0, "team-d": 4.0}
    cluster = Cluster("tight", uniform_nodes(24), project_queues(quotas))
    outcomes = []
    for shortcuts in (True, False):
        simulation = Simulation(
            prepare(policy, cluster), trace, quotas, SimSettings(shortcuts=shortcuts)
        )
        result = simulation.run()
        outcomes.append(
            [(s.first_start, s.end, s.preemptions, s.workload.placements) for s in simulation.jobs]
        )
        if shortcuts:
            assert result.skipped_cycles > 0
            # Backlogs under static and in the one fifo pool are hidden from the engine.
            if policy != "corral":
                assert simulation.hidden > 0 and simulation.rechecks > 0
    assert outcomes[0] == outcomes[1]


def test_a_horizon_stops_the_clock() -> None:
    jobs = [job("x", "a", 0, 100, 1), job("y", "a", 50, 1000, 1), job("z", "a", 400, 10, 1)]
    simulation = run(jobs, {"a": 2}, 2, SimSettings(horizon=200.0), "corral")
    result = simulation.result  # type: ignore[attr-defined]
    assert result.end == 200.0
    assert (result.completed, result.unstarted) == (1, 0)  # z had not even arrived
    assert [state.end for state in simulation.jobs][:1] == [100.0]
    # Measured over the 200 s it ran: x held 1 GPU for 100 s, y for 150 s, of 2 GPUs.
    assert result.allocation == pytest.approx((100 + 150) / (2 * 200))


@pytest.mark.parametrize(("aware", "victim", "lost"), [(False, "new", 500.0), (True, "old", 200.0)])
def test_checkpoint_aware_victims_lose_less(aware: bool, victim: str, lost: float) -> None:
    """One node of 2 GPUs; a and b deserve 1 each; checkpoints every 1800 s of progress.

    a's old job started at 0, its new one at 1500 (borrowing b's GPU). b's job arrives at
    2000 and reclaims one: the old job would lose 200 s since its checkpoint at 1800, the
    new one 500 s (it has not reached its first). Newest first takes the new one; told
    the checkpoints, the engine takes the old one."""
    jobs = [
        job("old", "a", 0, 10_000, 1),
        job("new", "a", 1500, 10_000, 1),
        job("b", "b", 2000, 600, 1),
    ]
    settings = SimSettings(checkpoint_interval=1800.0, restart_cost=60.0, checkpoint_aware=aware)
    simulation = run(jobs, {"a": 1, "b": 1}, 2, settings, "corral")
    states = {state.job.name: state for state in simulation.jobs}
    other = "old" if victim == "new" else "new"
    assert (states[victim].preemptions, states[victim].lost) == (1, lost)
    assert (states[other].preemptions, states[other].lost) == (0, 0.0)


@pytest.mark.parametrize(("min_runtime", "reclaimed_at"), [(None, 120.0), (600.0, 600.0)])
def test_the_simulator_honours_reclaim_min_runtime(
    min_runtime: float | None, reclaimed_at: float
) -> None:
    """One node of 2 GPUs; a and b deserve 1 each. a's job starts at 0 on both GPUs; b's
    arrives at 120 and reclaims one. With a 600 s reclaim min-runtime on every queue, a's
    job is no victim until it has run 600 s: the cycle at 120 changes nothing, and the
    simulator runs the next one when the job comes of age (nothing else happens until
    a's job ends at 10,000)."""
    jobs = [job("young", "a", 0, 10_000, 2), job("b", "b", 120, 600, 1)]
    trace = Trace("t", "test", tuple(jobs), 120)
    queues = tuple(
        replace(queue, reclaim_min_runtime=min_runtime)
        for queue in project_queues({"a": 1, "b": 1})
    )
    cluster = Cluster("c", (Node("node0", gpus=2),), queues)
    settings = SimSettings(cycle_interval=10.0, restart_cost=0.0)
    simulation = Simulation(prepare("corral", cluster), trace, cluster.quotas(), settings)
    simulation.run()
    states = {state.job.name: state for state in simulation.jobs}
    assert states["young"].preemptions == 1
    assert states["b"].first_start == reclaimed_at
