"""Pure functions of arrays and dependencies (`corral.model.arrays`) and of estimated
starts (`corral.engine.estimate`): no server, no database."""

from __future__ import annotations

import pytest

from corral.engine.estimate import estimate_start
from corral.model import Node, Placement, Queue, Snapshot, TaskGroup, Workload
from corral.model.arrays import MAX_ARRAY_SIZE, Dependency, parse_array, parse_dependency


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("0-99%8", tuple(range(100)), 8),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("7,1,1-2%1", (1, 2, 7), 1),
        (f"0-{MAX_ARRAY_SIZE - 1}", tuple(range(MAX_ARRAY_SIZE)), None),
    ],
)
def test_parse_array(text: str, indices: tuple[int, ...], limit: int | None) -> None:
    assert parse_array(text) == (indices, limit)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not an index"),
        ("0-", "not an index"),
        ("3-1", "ends before"),
        ("0-3%0", "limit"),
        ("0-3%x", "limit"),
        (f"0-{MAX_ARRAY_SIZE}", "at most"),
        ("1000000", "up to"),
        ("-1", "not an index"),
        ("1;2", "not an index"),
    ],
)
def test_parse_array_refuses(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_array(text)


def test_parse_dependency() -> None:
    assert parse_dependency("train") == Dependency("train", "ok")
    assert parse_dependency("train:any") == Dependency("train", "any")
    assert str(parse_dependency("train:ok")) == "train:ok"
    for bad in (":ok", "train:maybe"):
        with pytest.raises(ValueError):
            parse_dependency(bad)


def _running(name: str, gpu: float, devices: tuple[int, ...]) -> Workload:
    return Workload(
        name, "team", (TaskGroup(gpu=gpu),), placements=(Placement(0, "n1", devices, gpu),)
    )


def _snapshot(*workloads: Workload) -> Snapshot:
    return Snapshot((Node("n1", gpus=4),), (Queue("team"),), workloads)


def test_estimate_start() -> None:
    a = _running("a", 2, (0, 1))  # ends at 100
    b = _running("b", 1, (2,))  # ends at 50
    c = _running("c", 1, (3,))  # no known end
    wants_1 = Workload("w1", "team", (TaskGroup(gpu=1),), submitted=10)
    wants_2 = Workload("w2", "team", (TaskGroup(gpu=2),), submitted=11)
    wants_4 = Workload("w4", "team", (TaskGroup(gpu=4),), submitted=12)
    wants_8 = Workload("w8", "team", (TaskGroup(gpu=8),), submitted=13)
    snapshot = _snapshot(a, b, c, wants_1, wants_2, wants_4, wants_8)
    ends = {"a": 100.0, "b": 50.0}
    # 1 GPU: free once b ends. 2 GPUs: w1 (ahead of it) takes b's, so after a ends.
    assert estimate_start(snapshot, "w1", ends, 0.0) == 50.0
    assert estimate_start(snapshot, "w2", ends, 0.0) == 100.0
    # 4 GPUs need c's, whose end is unknown; 8 never fit.
    assert estimate_start(snapshot, "w4", ends, 0.0) is None
    assert estimate_start(snapshot, "w8", ends, 0.0) is None
    # An end already past (the task overran): it could start now.
    assert estimate_start(snapshot, "w1", {"b": 5.0}, 20.0) == 20.0
    free = _snapshot(b, wants_1)
    assert estimate_start(free, "w1", {}, 7.0) == 7.0
    with pytest.raises(KeyError):
        estimate_start(snapshot, "a", ends, 0.0)
