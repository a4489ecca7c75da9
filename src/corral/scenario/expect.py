"""Compare what `plan` found with what a scenario's `expect` section says."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from corral.model import Placement
from corral.scenario.runner import PlanResult, WorkloadOutcome
from corral.scenario.types import RunningExpectation, Scenario


def check_expectations(scenario: Scenario, result: PlanResult) -> list[str]:
    """One message per expectation that does not hold, in listing order.

    Empty when the scenario has no `expect` or every expectation holds. Workloads not
    named under `running` must end pending; `evicted` only requires that each workload
    named was evicted at least once.
    """
    expectations = scenario.expectations
    if expectations is None:
        return []
    failures: list[str] = []
    for name, outcome in result.workloads.items():
        expected = expectations.running.get(name)
        if expected is None:
            if outcome.status == "running":
                failures.append(f"{name}: expected pending, but it runs on {_nodes(outcome.nodes)}")
            continue
        failure = _check_running(name, expected, outcome)
        if failure is not None:
            failures.append(failure)
    evicted = {record.workload for record in result.evictions}
    failures.extend(
        f"{name}: expected to be evicted, but it never was"
        for name in expectations.evicted
        if name not in evicted
    )
    for group in expectations.same_gpu:
        failure = _check_same_gpu(group, result)
        if failure is not None:
            failures.append(failure)
    for name, nodes in expectations.reserved.items():
        held = result.reservations.get(name)
        if held is None:
            failures.append(f"{name}: expected a reservation of {_nodes(nodes)}, but it has none")
        elif tuple(sorted(held.nodes)) != nodes:
            failures.append(
                f"{name}: expected a reservation of {_nodes(nodes)}, "
                f"but it holds {_nodes(held.nodes)}"
            )
    return failures


def _check_running(name: str, expected: RunningExpectation, outcome: WorkloadOutcome) -> str | None:
    if outcome.status == "pending":
        return f"{name}: expected {expected.describe()}, but it is pending: {outcome.reason}"
    if expected.node is not None and any(node != expected.node for node in outcome.nodes):
        return (
            f"{name}: expected every task on {expected.node}, "
            f"but it runs on {_nodes(outcome.nodes)}"
        )
    # Which task runs where does not matter, only how many tasks run on each node.
    if expected.nodes is not None and Counter(expected.nodes) != Counter(outcome.nodes):
        return (
            f"{name}: expected running on {_nodes(expected.nodes)}, "
            f"but it runs on {_nodes(outcome.nodes)}"
        )
    return None


def _check_same_gpu(group: Sequence[str], result: PlanResult) -> str | None:
    devices: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for name in group:
        for placement in result.workloads[name].placements:
            devices.setdefault((placement.node, placement.devices), []).append(name)
    shared = len(devices) == 1 and all(len(indices) == 1 for _, indices in devices)
    if shared and all(result.workloads[name].placements for name in group):
        return None
    where = "; ".join(f"{name} {_devices(result.workloads[name].placements)}" for name in group)
    return f"same_gpu [{', '.join(group)}]: expected one shared device, but {where}"


def _devices(placements: Sequence[Placement]) -> str:
    if not placements:
        return "is pending"
    return "is on " + ", ".join(
        f"{placement.node} GPU {','.join(map(str, placement.devices)) or 'none'}"
        for placement in placements
    )


def _nodes(nodes: Sequence[str]) -> str:
    return f"[{', '.join(sorted(nodes))}]"
