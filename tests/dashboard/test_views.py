"""The dashboard's formatting and derivations, which dashboard.js repeats for live updates."""

from __future__ import annotations

from typing import Any

import pytest

from corral.dashboard import views


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "—"), (0, "0"), (4.0, "4"), (1.5, "1.5"), (0.125, "0.13"), (2 / 3, "0.67")],
)
def test_num(value: float | None, shown: str) -> None:
    assert views.num(value) == shown


def test_halves_round_up_as_in_the_browser() -> None:
    # Python's round() would give 82 and 0.12; Math.round gives 83 and 0.13.
    assert views.pct(82.5) == "83%"
    assert views.num(0.125) == "0.13"
    assert views.hours(0.0004) == "0"
    assert views.hours(0.0125) == "0.013"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "—"), (-3, "0s"), (45.9, "45s"), (192, "3m 12s"), (7500, "2h 5m"), (97200, "1d 3h")],
)
def test_duration(seconds: float | None, shown: str) -> None:
    assert views.duration(seconds) == shown


def test_an_inline_script_is_shown_as_written() -> None:
    assert views.command(["python", "train.py", "--lr", "1e-3 x"]) == (
        "python train.py --lr '1e-3 x'"
    )
    assert views.command(["python", "-c", "import os\nprint(1)\n"]) == (
        "python -c\nimport os\nprint(1)"
    )


def device(index: int, state: str, utilization: float | None, *names: str) -> dict[str, Any]:
    return {
        "node": "n1",
        "device": index,
        "state": state,
        "utilization": utilization,
        "source": "declared",
        "workloads": list(names),
    }


def running(name: str, devices: list[int], gpu: float) -> dict[str, Any]:
    return {"name": name, "placements": [{"node": "n1", "devices": devices, "gpu": gpu}]}


def test_activity_is_per_workload_of_what_it_was_given() -> None:
    devices = [
        device(0, "busy", 80, "whole"),
        device(1, "busy", 15, "half"),
        device(2, "busy", 40, "a", "b"),
        device(3, "idle", 0, "pair"),
        device(4, "busy", 60, "pair"),
        device(5, "free", 0),
    ]
    found = views.activity(
        devices,
        [
            running("whole", [0], 1),
            running("half", [1], 0.5),
            running("a", [2], 0.5),
            running("pair", [3, 4], 2),
            running("unsampled", [7], 1),
        ],
    )
    assert found["whole"] == {"utilization": 80, "state": "busy", "declared": True}
    # Half a device at 15% of the whole device is 30% of what it was given.
    assert found["half"]["utilization"] == 30
    # A shared device's figure stands for each of its holders.
    assert found["a"]["utilization"] == 40
    assert found["pair"] == {"utilization": 30, "state": "busy", "declared": True}
    assert "unsampled" not in found
    assert views.device_states(devices) == {"free": 1, "busy": 4, "idle": 1}


def test_queue_tree_puts_projects_under_their_department() -> None:
    queues = [
        {"name": "vision", "parent": "research"},
        {"name": "ops", "parent": None},
        {"name": "research", "parent": None},
        {"name": "nlp", "parent": "research"},
    ]
    assert [(q["name"], q["depth"]) for q in views.queue_tree(queues)] == [
        ("ops", 0),
        ("research", 0),
        ("nlp", 1),
        ("vision", 1),
    ]


def test_device_cells_without_telemetry_show_allocation() -> None:
    node = {
        "name": "n1",
        "devices": [
            {"index": 1, "model": "A100", "memory": 2**30, "virtual": False},
            {"index": 0, "model": "A100", "memory": 2**30, "virtual": False},
        ],
        "tasks": [{"workload": "w", "project": "p", "devices": [1]}],
    }
    [entry] = views.device_cells([node], None)
    assert [(c["index"], c["state"], c["workloads"]) for c in entry["cells"]] == [
        (0, "free", []),
        (1, "allocated", ["p/w"]),  # its key: names are unique within a project
    ]
