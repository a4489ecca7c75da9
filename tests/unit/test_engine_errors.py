"""The engine refuses bad input with its own errors, which stay ValueErrors for callers
that catch those."""

from __future__ import annotations

import pytest

from corral.engine import ConfigError, EngineError, SnapshotError, schedule
from corral.model import Node, Placement, Queue, SchedulerConfig, Snapshot, TaskGroup, Workload


def snapshot(*workloads: Workload) -> Snapshot:
    return Snapshot((Node("n1", gpus=2),), (Queue("dept"), Queue("a", parent="dept")), workloads)


def test_errors_are_value_errors() -> None:
    assert issubclass(SnapshotError, EngineError)
    assert issubclass(ConfigError, EngineError)
    assert issubclass(EngineError, ValueError)


def test_a_workload_outside_a_leaf_queue_is_a_snapshot_error() -> None:
    with pytest.raises(SnapshotError, match="workload w: 'dept' is not a leaf queue"):
        schedule(snapshot(Workload("w", "dept", (TaskGroup(gpu=1.0),))))


def test_a_task_on_an_unknown_node_is_a_snapshot_error() -> None:
    placed = (Placement(0, "n9", (0,), 1.0),)
    with pytest.raises(SnapshotError, match="workload w: unknown node 'n9'"):
        schedule(snapshot(Workload("w", "a", (TaskGroup(gpu=1.0),), placements=placed)))


def test_an_unknown_action_is_a_config_error() -> None:
    config = SchedulerConfig(actions=("allocate", "backfill"))
    with pytest.raises(ConfigError, match="unknown action 'backfill'; expected one of allocate"):
        schedule(snapshot(), config)
