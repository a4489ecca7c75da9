"""Scenario files: a cluster at one moment, read into a snapshot, run through the engine
cycle after cycle (`plan`), and checked against what the file expects.

    scenario = load_scenario("tests/scenarios/S08-reclaim-basic.yaml")
    result = plan(scenario)
    failures = check_expectations(scenario, result)
"""

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports

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
__getattr__ = lazy_exports(
    __name__,
    {
        "ScenarioError": ("errors", "ScenarioError"),
        "check_expectations": ("expect", "check_expectations"),
        "load_scenario": ("loader", "load_scenario"),
        "parse_scenario": ("loader", "parse_scenario"),
        "EvictionRecord": ("runner", "EvictionRecord"),
        "PlanResult": ("runner", "PlanResult"),
        "QueueOutcome": ("runner", "QueueOutcome"),
        "WorkloadOutcome": ("runner", "WorkloadOutcome"),
        "plan": ("runner", "plan"),
        "MAX_CYCLES": ("types", "MAX_CYCLES"),
        "UNTIL_STABLE": ("types", "UNTIL_STABLE"),
        "Cycles": ("types", "Cycles"),
        "Expectations": ("types", "Expectations"),
        "RunningExpectation": ("types", "RunningExpectation"),
        "Scenario": ("types", "Scenario"),
    },
)


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
