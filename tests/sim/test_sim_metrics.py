"""Each metric: the formulas, the time-weighted recorder, and fairness, utilisation and
usage as a simulation reports them."""

from __future__ import annotations

import numpy as np
import pytest

from corral.model import Node, TaskGroup
from corral.sim import (
    Cluster,
    Job,
    SimSettings,
    Trace,
    jain,
    prepare,
    project_queues,
    simulate,
    stats,
    synthetic_trace,
    uniform_nodes,
)
from corral.sim.metrics import BUSY, ENTITLED, HELD, PENDING, RECEIVED, Recorder, sample_interval


def test_stats_mean_and_linear_percentiles() -> None:
    result = stats([4.0, 1.0, 3.0, 2.0])
    assert (result.count, result.mean, result.p50) == (4, 2.5, 2.5)
    # Linear interpolation between order statistics: rank 0.95 * 3 = 2.85.
    assert result.p95 == pytest.approx(3.85)
    assert result.p99 == pytest.approx(3.97)
    assert stats([]).mean is None and stats([]).count == 0


def test_jain_index() -> None:
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([2.0, 1.0]) == pytest.approx(9 / 10)
    assert jain([]) is None


def test_sample_interval_is_round() -> None:
    assert sample_interval(72 * 3600, 10) == 900  # 72 h / 400 = 648 s, rounded up
    assert sample_interval(600, 10) == 60
    assert sample_interval(109 * 86400, 10) == 43200


def test_recorder_integrates_levels_over_time() -> None:
    """Projects 0 and 1 with quotas 2 and 1; a 100 s window; 50 s samples.

    0..150: project 0 holds 2 GPUs. 40..60: project 1 asks for 3 GPUs; 60..150 it holds 1
    and still asks for 2."""
    recorder = Recorder([2.0, 1.0], window=100.0, sample=50.0)
    recorder.change(0, held=2.0)
    recorder.advance(40.0)
    recorder.change(1, pending=3.0)
    recorder.advance(60.0)
    recorder.change(1, held=1.0, pending=-1.0)
    recorder.advance(150.0)
    window = recorder.in_window
    assert window[HELD].tolist() == [200.0, 40.0]
    assert window[PENDING].tolist() == [0.0, 3 * 20 + 2 * 40]
    # Entitled: min(quota, held + pending); received: min(held, entitled).
    assert window[ENTITLED].tolist() == [200.0, 20.0 + 40.0]
    assert window[RECEIVED].tolist() == [200.0, 40.0]
    assert window[BUSY].tolist() == [0.0, 0.0]
    assert recorder.in_run[HELD].tolist() == [300.0, 90.0]
    assert recorder.peak_pending == 3.0
    times, means = recorder.series(150.0)
    assert times.tolist() == [0.0, 50.0, 100.0]
    assert means[:, HELD, 1].tolist() == pytest.approx([0.0, 0.8, 1.0])
    assert means[:, PENDING, 1].tolist() == pytest.approx([0.6, 2.2, 2.0])
    assert means[:, HELD, 0].tolist() == pytest.approx([2.0, 2.0, 2.0])


def _one_gpu(name: str, project: str, submitted: float, duration: float) -> Job:
    return Job(name, project, submitted, duration, (TaskGroup(gpu=1.0),))


FAIRNESS_TRACE = Trace(
    "fair",
    "test",
    (
        _one_gpu("a1", "a", 0, 1000),
        _one_gpu("a2", "a", 0, 1000),
        _one_gpu("b1", "b", 100, 500),
        _one_gpu("a3", "a", 1000, 10),
    ),
    span=1000.0,
)


@pytest.mark.parametrize(("policy", "fairness"), [("fifo", 0.5), ("corral", 1.0)])
def test_fairness_is_jain_over_entitlement_received(policy: str, fairness: float) -> None:
    """One node of 2 GPUs, projects a and b deserving 1 each. a takes both GPUs at 0;
    b asks for one at 100. fifo makes b wait until 1000 (received 0 of its entitlement
    over the window: Jain of [1, 0] = 0.5); corral reclaims at 100 (Jain of [1, 1])."""
    cluster = Cluster("c", (Node("node0", gpus=2),), project_queues({"a": 1, "b": 1}))
    result = simulate(prepare(policy, cluster), FAIRNESS_TRACE, cluster.quotas())
    assert result.fairness == pytest.approx(fairness)
    b = result.by_project["b"]
    assert b.entitlement_received == pytest.approx(1.0 if policy == "corral" else 0.0)
    assert b.queueing_delay.mean == pytest.approx(0.0 if policy == "corral" else 900.0)


def test_allocation_usage_and_utilisation_agree() -> None:
    trace = synthetic_trace(seed=2).head(150)
    cluster = Cluster("c", uniform_nodes(32), project_queues(trace.quotas))
    result = simulate(prepare("corral", cluster), trace, cluster.quotas(), SimSettings())
    projects = result.by_project.values()
    # Allocation is the projects' mean GPUs over the cluster's GPUs.
    assert result.allocation == pytest.approx(sum(p.mean_gpus for p in projects) / result.gpus)
    assert result.gpu_hours == pytest.approx(sum(p.gpu_hours for p in projects))
    # Every synthetic job reports utilisation, below 1: busy is a part of allocated.
    assert result.utilisation is not None and 0 < result.utilisation < result.allocation
    # The sampled series (bucket means) integrates back to the GPU-hours of the run.
    lengths = np.diff(np.append(result.series.times, result.end))
    held = float((result.series.held.sum(axis=1) * lengths).sum())
    assert held / 3600 == pytest.approx(result.gpu_hours)
    assert result.completed + result.unstarted <= result.jobs
    assert sum(p.jobs for p in projects) == result.jobs


def test_utilisation_is_absent_when_the_trace_has_none() -> None:
    trace = Trace("t", "test", (_one_gpu("x", "a", 0, 100),), span=50.0)
    cluster = Cluster("c", (Node("node0", gpus=1),), project_queues({"a": 1}))
    result = simulate(prepare("corral", cluster), trace, cluster.quotas())
    assert result.utilisation is None
    assert result.allocation == 1.0  # held its one GPU over the whole 50 s window
