"""The simulator's shortcuts change nothing: on random workloads, with bursts that leave
one project with a backlog while the others wait for nothing, a run that skips quiet
cycles and hides pending work the engine cannot act on starts, ends and preempts every
job exactly as a run that shows every cycle all of its pending work."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from corral.model import PRIORITY_CLASSES, TaskGroup
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
from corral.sim.synthetic import ProjectLoad

# Minutes of work: started before the other modules (tests/conftest.py).
pytestmark = pytest.mark.long

Outcome = list[tuple[float, float, int, tuple[object, ...]]]


def job(name: str, project: str, submitted: float, **fields: Any) -> Job:
    """A one-GPU job of a day's work."""
    return Job(name, project, submitted, 86400.0, (TaskGroup(gpu=1.0),), **fields)


def outcomes(
    policy: str, trace: Trace, cluster: Cluster, shortcuts: bool
) -> tuple[Outcome, Simulation]:
    simulation = Simulation(
        prepare(policy, cluster), trace, cluster.quotas(), SimSettings(shortcuts=shortcuts)
    )
    simulation.run()
    jobs = [
        (state.first_start, state.end, state.preemptions, state.workload.placements)
        for state in simulation.jobs
    ]
    return jobs, simulation


@st.composite
def loads(draw: st.DrawFn) -> tuple[ProjectLoad, ...]:
    """Two to four projects; the first floods in bursts (many small jobs or a few
    large ones), the others submit now and then."""
    count = draw(st.integers(2, 4))
    projects = []
    for index in range(count):
        flooder = index == 0
        interactive = draw(st.floats(0.0, 0.5))
        distributed = draw(st.floats(0.0, 0.3))
        projects.append(
            ProjectLoad(
                f"p{index}",
                quota=float(draw(st.integers(0, 16))),
                rate=draw(st.floats(2.0, 12.0) if flooder else st.floats(0.05, 1.5)),
                interactive=interactive,
                training=1.0 - interactive - distributed,
                distributed=distributed,
                burst_every=draw(st.sampled_from((6.0, 12.0))),
                burst_hours=draw(st.sampled_from((0.0, 2.0, 4.0))),
                burst_factor=draw(st.sampled_from((1.0, 3.0, 6.0))),
            )
        )
    return tuple(projects)


@settings(
    max_examples=int(os.environ.get("CORRAL_SIM_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    projects=loads(),
    seed=st.integers(0, 2**16),
    nodes=st.integers(2, 5),
    shown=st.sampled_from((2, 8, 64)),
)
def test_corral_runs_alike_with_and_without_shortcuts(
    projects: tuple[ProjectLoad, ...], seed: int, nodes: int, shown: int
) -> None:
    trace = synthetic_trace(seed=seed, hours=12.0, projects=projects)
    if not trace.jobs:
        return
    quotas = {project.name: project.quota for project in projects}
    cluster = Cluster("random", uniform_nodes(8 * nodes), project_queues(quotas))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulator, "_SHOWN_PER_QUEUE", shown)
        fast, simulation = outcomes("corral", trace, cluster, True)
    event("work hidden" if simulation.hidden else "nothing hidden")
    event("a cycle run again" if simulation.rechecks else "no cycle run again")
    slow, _ = outcomes("corral", trace, cluster, False)
    assert fast == slow


def test_a_lone_backlog_is_hidden_from_reclaiming_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    """One project floods a 16-GPU cluster with small jobs while another runs its quota:
    corral's cycles (which may reclaim) see only the head of the backlog, and now and
    then a cycle is run again whole; the run is the same as one that sees it all."""
    monkeypatch.setattr(simulator, "_SHOWN_PER_QUEUE", 4)
    projects = (
        ProjectLoad(
            "flood", 8.0, 20.0, 0.0, 1.0, 0.0, burst_every=6, burst_hours=2, burst_factor=4
        ),
        ProjectLoad("steady", 8.0, 0.5, 0.0, 1.0, 0.0),
    )
    trace = synthetic_trace(seed=3, hours=12.0, projects=projects)
    cluster = Cluster("small", uniform_nodes(16), project_queues({"flood": 8.0, "steady": 8.0}))
    fast, simulation = outcomes("corral", trace, cluster, True)
    slow, _ = outcomes("corral", trace, cluster, False)
    assert simulation.hidden > 0 and simulation.rechecks > 0
    assert fast == slow


def test_hidden_work_that_could_reclaim_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes of 8 GPUs; q and r deserve 4 each. r's 12 training jobs borrow; q runs 2
    interactive jobs. Then q asks for 12 more interactive jobs and 20 training jobs: two
    interactive fit in the 2 free GPUs and the other ten wait for q's deserved quota, so
    no work the cycle shows may reclaim; the training jobs behind them may (q is under
    its fair share of 8, r over its own), so the cycle must see them."""
    interactive = {"priority": PRIORITY_CLASSES["interactive"], "preemptible": False}
    jobs = [job(f"r{i}", "r", 0.0) for i in range(12)]
    jobs += [job(f"q-i{i}", "q", 0.0, **interactive) for i in range(2)]
    jobs += [job(f"q-i{i}", "q", 100.0, **interactive) for i in range(2, 14)]
    jobs += [job(f"q-t{i}", "q", 100.0) for i in range(20)]
    trace = Trace("t", "test", tuple(jobs), 200.0)
    cluster = Cluster("two nodes", uniform_nodes(16), project_queues({"q": 4.0, "r": 4.0}))
    fast, simulation = outcomes("corral", trace, cluster, True)
    slow, _ = outcomes("corral", trace, cluster, False)
    assert fast == slow
    assert simulation.rechecks > 0
    # The training jobs start at once, on GPUs reclaimed from r.
    assert {state.first_start for state in simulation.jobs if state.job.name == "q-t0"} == {100.0}
