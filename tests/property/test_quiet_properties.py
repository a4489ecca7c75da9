"""The quiet-cycle check (engine.quiet.CycleGate): on random clusters like the
simulator's, a cycle the gate judges quiet decides nothing when it is run."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from strategies import leaves, node_tuples, queue_tuples
from test_engine_properties import EXAMPLES

from corral.engine import apply_decisions, schedule
from corral.engine.quiet import CycleGate
from corral.model import SchedulerConfig, Snapshot, TaskGroup, Workload

QUIET = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ACTIONS = (
    ("allocate", "consolidate", "reclaim", "preempt"),
    ("allocate",),
    ("allocate", "reclaim"),
    ("allocate", "preempt"),
)


@st.composite
def jobs(draw: st.DrawFn, queues: list[str], first: int, count: int) -> list[Workload]:
    """`count` pending whole (not elastic) workloads named j{first}..., as the simulator
    makes them: one group of tasks, some asking for CPU too."""
    made = []
    for number in range(first, first + count):
        group = TaskGroup(
            gpu=draw(st.sampled_from((0.5, 1.0, 1.0, 2.0, 4.0))),
            replicas=draw(st.integers(1, 3)),
            cpu=draw(st.sampled_from((0.0, 0.0, 2.0))),
        )
        made.append(
            Workload(
                f"j{number}",
                draw(st.sampled_from(queues)),
                (group,),
                priority=draw(st.sampled_from((50, 100, 150))),
                preemptible=draw(st.booleans()),
                node_selector=draw(st.sampled_from(({}, {}, {"rack": ("r1",)}))),
                submitted=float(number),
            )
        )
    return made


@st.composite
def settled_snapshots(draw: st.DrawFn) -> tuple[Snapshot, SchedulerConfig]:
    """A cluster after a few cycles over some work, with new work arrived since."""
    nodes = draw(node_tuples())
    queues = draw(queue_tuples())
    config = SchedulerConfig(actions=draw(st.sampled_from(ACTIONS)))
    names = leaves(queues)
    before = draw(st.integers(0, 8))
    snapshot = Snapshot(nodes, queues, tuple(draw(jobs(names, 0, before))))
    for _ in range(draw(st.integers(0, 3))):
        snapshot = apply_decisions(snapshot, schedule(snapshot, config))
    arrived = draw(jobs(names, before, draw(st.integers(0, 4))))
    return replace(snapshot, workloads=(*snapshot.workloads, *arrived)), config


@QUIET
@given(settled_snapshots())
def test_a_cycle_judged_quiet_decides_nothing(drawn: tuple[Snapshot, SchedulerConfig]) -> None:
    snapshot, config = drawn
    if CycleGate.of(snapshot, config.actions).may_change():
        event("may change")
        return
    event("quiet")
    decisions = schedule(snapshot, config)
    note(f"decisions: {decisions}")
    assert not decisions.bindings
    assert not decisions.evictions
