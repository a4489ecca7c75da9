"""One limit, every way in (corral.spec.limits): what the API refuses of a workload's
tasks, a scenario file is refused for too, with the same words, so that `corral plan`
never plans a workload the server would not take."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
import yaml

from corral.api.schemas.workloads import WorkloadIn
from corral.scenario import ScenarioError, parse_scenario
from corral.spec.limits import MAX_GPUS_PER_TASK, MAX_TASK_GROUPS, MAX_TASKS

# Each case: task groups as both the API and a scenario file write them, and the words
# both refuse them with.
CASES = {
    "gpus per task": (
        [{"name": "big", "replicas": 1, "gpu": MAX_GPUS_PER_TASK + 1}],
        f"at most {MAX_GPUS_PER_TASK} GPUs per task",
    ),
    "task groups": (
        [{"name": f"g{i}", "replicas": 1, "gpu": 1} for i in range(MAX_TASK_GROUPS + 1)],
        f"at most {MAX_TASK_GROUPS}",
    ),
    "tasks": (
        [{"name": f"g{i}", "replicas": 1000, "gpu": 0.5} for i in range(5)],
        f"at most {MAX_TASKS} tasks in one workload",
    ),
}


def scenario(groups: list[dict[str, Any]]) -> str:
    document = {
        "name": "limits",
        "nodes": [{"name": "n0", "gpus": 8}],
        "queues": [{"name": "team", "deserved": 8}],
        "workloads": [{"name": "w", "queue": "team", "tasks": groups}],
    }
    return yaml.safe_dump(document, sort_keys=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_api_and_a_scenario_file_refuse_the_same_tasks(case: str) -> None:
    groups, words = CASES[case]
    with pytest.raises(pydantic.ValidationError) as api:
        WorkloadIn.model_validate({"project": "team", "tasks": groups, "command": ["true"]})
    assert words in str(api.value), api.value
    with pytest.raises(ScenarioError) as plan:
        parse_scenario(scenario(groups), "S.yaml")
    assert words in str(plan.value), plan.value
    assert "workloads[0].tasks" in str(plan.value), plan.value


def test_the_largest_tasks_both_accept_are_accepted_by_both() -> None:
    groups = [{"name": "big", "replicas": 1, "gpu": MAX_GPUS_PER_TASK}] + [
        {"name": f"g{i}", "replicas": 1, "gpu": 1} for i in range(MAX_TASK_GROUPS - 1)
    ]
    WorkloadIn.model_validate({"project": "team", "tasks": groups, "command": ["true"]})
    loaded = parse_scenario(scenario(groups), "S.yaml")
    [workload] = loaded.snapshot.workloads
    assert sum(group.replicas for group in workload.task_groups) == MAX_TASK_GROUPS
