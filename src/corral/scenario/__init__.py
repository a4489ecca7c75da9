"""Scenario files: a cluster at one moment, read into a snapshot, run through the engine
cycle after cycle (`plan`), and checked against what the file expects.

    scenario = load_scenario("tests/scenarios/S08-reclaim-basic.yaml")
    result = plan(scenario)
    failures = check_expectations(scenario, result)
"""

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
