"""Scenario files: a cluster at one moment, read into a snapshot, run through the engine
cycle after cycle (`plan`), and checked against what the file expects.

    scenario = load_scenario("tests/scenarios/S08-reclaim-basic.yaml")
    result = plan(scenario)
    failures = check_expectations(scenario, result)
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.scenario.errors import ScenarioError
    from corral.scenario.expect import check_expectations
    from corral.scenario.loader import load_scenario, parse_scenario
    from corral.scenario.runner import (
        EvictionRecord,
        PlanResult,
        QueueOutcome,
        WorkloadOutcome,
        plan,
    )
    from corral.scenario.types import (
        MAX_CYCLES,
        UNTIL_STABLE,
        Cycles,
        Expectations,
        RunningExpectation,
        Scenario,
    )

# Each name is imported from its module when first used, so that a command that needs one
# module (the CLI's error handling, submit's YAML reader) does not load the engine.
_MODULES = {
    "ScenarioError": "errors",
    "check_expectations": "expect",
    "load_scenario": "loader",
    "parse_scenario": "loader",
    "EvictionRecord": "runner",
    "PlanResult": "runner",
    "QueueOutcome": "runner",
    "WorkloadOutcome": "runner",
    "plan": "runner",
    "MAX_CYCLES": "types",
    "UNTIL_STABLE": "types",
    "Cycles": "types",
    "Expectations": "types",
    "RunningExpectation": "types",
    "Scenario": "types",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "MAX_CYCLES",
    "UNTIL_STABLE",
    "Cycles",
    "EvictionRecord",
    "Expectations",
    "PlanResult",
    "QueueOutcome",
    "RunningExpectation",
    "Scenario",
    "ScenarioError",
    "WorkloadOutcome",
    "check_expectations",
    "load_scenario",
    "parse_scenario",
    "plan",
]
