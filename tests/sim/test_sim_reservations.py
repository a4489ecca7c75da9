"""The simulator with reservations: it tells the engine how long jobs have waited and
run and gives them max runtimes from their durations, so that a gang behind a stream of
small jobs starts once its node drains instead of waiting for the stream to end."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from corral.model import Node, SchedulerConfig, TaskGroup
from corral.sim import (
    Cluster,
    Job,
    SimError,
    SimSettings,
    Simulation,
    Trace,
    prepare,
    project_queues,
)


def _job(name: str, project: str, submitted: float, duration: float, gpus: int) -> Job:
    return Job(name, project, submitted, duration, (TaskGroup(gpu=float(gpus)),))


# One node of 2 GPUs. A 1-GPU job arrives every 500 s and runs 1,000 s, so one GPU frees
# every 500 s and is taken at once by the next; the gang (2 GPUs) arrives at 10 s.
STREAM = [_job(f"s{n:02d}", "small", n * 500.0, 1000.0, 1) for n in range(20)]
GANG = _job("gang", "big", 10.0, 600.0, 2)


def _gang_start(reserve_after: float | None, factor: float | None) -> float:
    jobs = (*STREAM, GANG)
    trace = Trace("t", "test", tuple(sorted(jobs, key=lambda j: j.submitted)), 10_000.0)
    queues = tuple(
        replace(queue, reserve_after=reserve_after)
        for queue in project_queues({"big": 1.0, "small": 1.0})
    )
    # Allocate only: nothing is reclaimed for the gang, which must wait for room.
    config = SchedulerConfig(actions=("allocate",))
    cluster = Cluster("c", (Node("node0", gpus=2),), queues, config)
    settings = SimSettings(cycle_interval=10.0, max_runtime_factor=factor)
    simulation = Simulation(prepare("corral", cluster), trace, cluster.quotas(), settings)
    simulation.run()
    return simulation.by_name["gang"].first_start


def test_without_reservations_the_gang_waits_for_the_stream_to_end() -> None:
    assert _gang_start(None, 1.0) >= STREAM[-1].submitted


def test_with_a_reservation_the_gang_starts_when_its_node_drains() -> None:
    start = _gang_start(300.0, 1.0)
    # Reserved from its first cycle after 300 s of waiting; the two jobs then running
    # end by 2,000 s at the latest, and no new one is placed on the node meanwhile.
    assert 1000.0 <= start <= 2000.0


def test_with_no_max_runtimes_the_node_drains_too() -> None:
    start = _gang_start(300.0, None)
    assert 1000.0 <= start <= 2000.0


@pytest.mark.parametrize("factor", [0.0, -1.0, math.inf, math.nan])
def test_a_bad_max_runtime_factor_is_refused(factor: float) -> None:
    trace = Trace("t", "test", (GANG,), 10.0)
    cluster = Cluster("c", (Node("node0", gpus=2),), project_queues({"big": 1.0}))
    with pytest.raises(SimError, match="max runtime factor"):
        Simulation(
            prepare("corral", cluster),
            trace,
            cluster.quotas(),
            SimSettings(max_runtime_factor=factor),
        )
