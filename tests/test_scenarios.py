"""Scheduling behaviour pinned by scenario files, and the machinery that runs and checks them."""

from dataclasses import replace
from pathlib import Path

import pytest

from corral.model import (
    Decisions,
    Eviction,
    Placement,
    QueueStatus,
    Resources,
    SchedulerConfig,
    Snapshot,
)
from corral.scenario import (
    MAX_CYCLES,
    EvictionRecord,
    PlanResult,
    QueueOutcome,
    Scenario,
    WorkloadOutcome,
    check_expectations,
    load_scenario,
    parse_scenario,
    plan,
)

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[path.stem for path in SCENARIOS])
def test_scenario(path: Path) -> None:
    scenario = load_scenario(path)
    failures = check_expectations(scenario, plan(scenario))
    assert not failures, "\n".join(failures)


# --- running cycles (with a scripted engine, so that only the runner is under test) --------

CLUSTER = """
name: scripted
nodes: [{name: node0, gpus: 2}]
queues: [{name: q, deserved: 1.5}]
workloads:
  - {name: old, queue: q, tasks: 1x1, status: running, node: node0}
  - {name: new, queue: q, tasks: 2x1}
"""

QUEUES = {
    "q": QueueStatus(
        deserved=Resources(1.5),
        limit=Resources(4),
        fair_share=Resources(1 / 3 + 1 / 3 + 1 / 3),
        allocated=Resources(2),
        requested=Resources(3),
    )
}
EVICT_OLD = Eviction("old", (0,), "reclaim", "new", "q is over its fair share")
BIND_NEW = {"new": (Placement(0, "node0", (0,), 1.0), Placement(1, "node0", (1,), 1.0))}
QUIET = Decisions({}, (), {"old": "node0 is full"}, QUEUES)


def scripted(monkeypatch: pytest.MonkeyPatch, cycles: list[Decisions]) -> list[Snapshot]:
    """Make `plan` see `cycles` in turn (the last one repeats); returns the snapshots seen."""
    seen: list[Snapshot] = []

    def schedule(snapshot: Snapshot, config: SchedulerConfig) -> Decisions:
        seen.append(snapshot)
        return cycles[min(len(seen), len(cycles)) - 1]

    def apply_decisions(snapshot: Snapshot, decisions: Decisions) -> Snapshot:
        evicted = {eviction.workload for eviction in decisions.evictions}
        workloads = []
        for workload in snapshot.workloads:
            placements = () if workload.name in evicted else workload.placements
            workloads.append(
                replace(workload, placements=placements + decisions.bindings.get(workload.name, ()))
            )
        return replace(snapshot, workloads=tuple(workloads))

    monkeypatch.setattr("corral.scenario.runner.schedule", schedule)
    monkeypatch.setattr("corral.scenario.runner.apply_decisions", apply_decisions)
    return seen


def scenario(run: str = "until-stable") -> Scenario:
    return parse_scenario(f"{CLUSTER}run: {{cycles: {run}}}\n", "scripted.yaml")


def test_until_stable_stops_after_the_first_cycle_that_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = scripted(monkeypatch, [Decisions(BIND_NEW, (EVICT_OLD,), {}, QUEUES), QUIET])
    result = plan(scenario())
    assert result.cycles == 2
    assert len(seen) == 2
    assert [w.name for w in seen[1].workloads if w.placements] == ["new"]
    assert result.evictions == (
        EvictionRecord("old", 1, "reclaim", "new", "q is over its fair share"),
    )
    assert result.workloads["old"] == WorkloadOutcome(reason="node0 is full")
    assert result.workloads["new"].nodes == ("node0", "node0")
    assert result.workloads["new"].gpus == ((0,), (1,))
    assert result.queues == {"q": QueueOutcome(deserved=1.5, fair_share=1.0, allocated=2.0)}


def test_until_stable_gives_up_after_max_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    flapping = Decisions({}, (EVICT_OLD,), {}, QUEUES)
    seen = scripted(monkeypatch, [flapping])
    assert plan(scenario()).cycles == MAX_CYCLES
    assert len(seen) == MAX_CYCLES


def test_a_fixed_run_runs_exactly_its_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = scripted(monkeypatch, [QUIET])
    assert plan(scenario("3")).cycles == 3
    assert len(seen) == 3
    scripted(monkeypatch, [Decisions({}, (), {"new": "waiting"}, QUEUES), QUIET])
    result = plan(scenario("1"))
    assert result.cycles == 1
    assert result.workloads["new"].reason == "waiting"


def test_a_workload_evicted_in_the_last_cycle_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, [Decisions({}, (EVICT_OLD,), {}, QUEUES)])
    result = plan(scenario("1"))
    assert result.workloads["old"].reason == (
        "evicted (reclaim) in cycle 1: q is over its fair share"
    )


def test_to_json_has_the_documented_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, [Decisions(BIND_NEW, (EVICT_OLD,), {}, QUEUES), QUIET])
    assert plan(scenario()).to_json() == {
        "cycles": 2,
        "workloads": {
            "old": {"status": "pending", "reason": "node0 is full"},
            "new": {"status": "running", "nodes": ["node0", "node0"], "gpus": [[0], [1]]},
        },
        "evictions": [
            {
                "workload": "old",
                "cycle": 1,
                "action": "reclaim",
                "by": "new",
                "reason": "q is over its fair share",
            }
        ],
        "queues": {"q": {"deserved": 1.5, "fair_share": 1, "allocated": 2}},
    }


def test_json_numbers_are_ints_when_whole() -> None:
    result = PlanResult(1, {}, (), {"q": QueueOutcome(2.0, 0.1 + 0.2, 3.0000000001)})
    assert result.to_json()["queues"] == {"q": {"deserved": 2, "fair_share": 0.3, "allocated": 3}}


# --- checking expectations --------------------------------------------------------------

EXPECTING = """
name: checks
nodes: [{name: node0, gpus: 4}, {name: node1, gpus: 4}]
queues: [{name: q}]
workloads:
  - {name: gang, queue: q, tasks: 2x1}
  - {name: elastic, queue: q, tasks: 3x1, min_available: 1}
  - {name: half-a, queue: q, tasks: 1x0.5}
  - {name: half-b, queue: q, tasks: 1x0.5}
  - {name: idle, queue: q, tasks: 1x1}
"""


def running(*where: tuple[str, int], gpu: float = 1.0) -> WorkloadOutcome:
    return WorkloadOutcome(
        tuple(Placement(task, node, (device,), gpu) for task, (node, device) in enumerate(where))
    )


PENDING = WorkloadOutcome(reason="no room")


def outcome(
    evicted: tuple[str, ...] = (), changes: dict[str, WorkloadOutcome] | None = None
) -> PlanResult:
    """A result where every expectation of ALL_HOLD but `evicted` holds, then `changes`."""
    states = {
        "gang": running(("node1", 0), ("node0", 0)),
        "elastic": running(("node0", 1), ("node0", 2)),
        "half-a": running(("node1", 3), gpu=0.5),
        "half-b": running(("node1", 3), gpu=0.5),
        "idle": PENDING,
    }
    states.update(changes or {})
    records = tuple(EvictionRecord(name, 1, "preempt", None, "why") for name in evicted)
    return PlanResult(1, states, records, {})


def expecting(expect: str) -> Scenario:
    return parse_scenario(f"{EXPECTING}expect:\n{expect}", "checks.yaml")


ALL_HOLD = """
  running:
    gang: [node0, node1]
    elastic: [node0, node0]
    half-a: node1
    half-b: any
  pending: [idle]
  evicted: [gang]
  same_gpu: [[half-a, half-b]]
"""


def test_expectations_that_hold() -> None:
    assert check_expectations(expecting(ALL_HOLD), outcome(evicted=("gang",))) == []


def test_no_expect_section_means_nothing_to_check() -> None:
    scenario = parse_scenario(EXPECTING, "checks.yaml")
    assert check_expectations(scenario, outcome(changes={"gang": PENDING})) == []


def test_a_node_list_is_a_multiset() -> None:
    result = outcome(evicted=("gang",), changes={"gang": running(("node0", 0), ("node0", 1))})
    assert check_expectations(expecting(ALL_HOLD), result) == [
        "gang: expected running on [node0, node1], but it runs on [node0, node0]"
    ]


def test_an_elastic_workload_must_run_exactly_the_tasks_listed() -> None:
    result = outcome(
        evicted=("gang",), changes={"elastic": running(("node0", 1), ("node0", 2), ("node0", 3))}
    )
    assert check_expectations(expecting(ALL_HOLD), result) == [
        "elastic: expected running on [node0, node0], but it runs on [node0, node0, node0]"
    ]


def test_a_single_node_means_every_task_there() -> None:
    expect = "  running: {gang: node0, elastic: any, half-a: any, half-b: any}\n  pending: [idle]\n"
    assert check_expectations(expecting(expect), outcome()) == [
        "gang: expected every task on node0, but it runs on [node0, node1]"
    ]


def test_expected_running_but_pending() -> None:
    result = outcome(evicted=("gang",), changes={"half-b": PENDING})
    assert check_expectations(expecting(ALL_HOLD), result) == [
        "half-b: expected running, but it is pending: no room",
        "same_gpu [half-a, half-b]: expected one shared device, "
        "but half-a is on node1 GPU 3; half-b is pending",
    ]


def test_every_workload_not_named_running_must_end_pending() -> None:
    result = outcome(evicted=("gang",), changes={"idle": running(("node1", 0))})
    assert check_expectations(expecting(ALL_HOLD), result) == [
        "idle: expected pending, but it runs on [node1]"
    ]
    expect = "  running: {gang: any, elastic: any, half-a: any}\n"
    assert check_expectations(expecting(expect), outcome()) == [
        "half-b: expected pending, but it runs on [node1]"
    ]


def test_evicted_is_checked_one_way() -> None:
    assert check_expectations(expecting(ALL_HOLD), outcome()) == [
        "gang: expected to be evicted, but it never was"
    ]
    assert check_expectations(expecting(ALL_HOLD), outcome(evicted=("gang", "elastic"))) == []


def test_same_gpu_needs_the_same_node_and_device() -> None:
    result = outcome(evicted=("gang",), changes={"half-b": running(("node1", 2), gpu=0.5)})
    assert check_expectations(expecting(ALL_HOLD), result) == [
        "same_gpu [half-a, half-b]: expected one shared device, "
        "but half-a is on node1 GPU 3; half-b is on node1 GPU 2"
    ]
