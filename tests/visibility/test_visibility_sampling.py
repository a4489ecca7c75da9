"""How the agent turns readings into samples, and what a task's declaration means."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corral.agent.telemetry import (
    DeviceReading,
    Holder,
    ProcessReading,
    Sampler,
    attribute_declared,
    attribute_measured,
    interval_from_env,
    read_declaration,
)
from corral.model.spec import Device
from corral.sdk import report_utilization

GIB = 1 << 30
NOW = 10_000.0


def holder(name: str, devices: tuple[int, ...], gpu: float, pgid: int, **more: object) -> Holder:
    return Holder(name, 0, devices, gpu, pgid, NOW - 100, **more)  # type: ignore[arg-type]


def reading(utilization: float, processes: dict[int, ProcessReading]) -> DeviceReading:
    return DeviceReading(utilization, 30 * GIB, 80 * GIB, 250.0, 61.0, processes)


def test_a_whole_device_holder_gets_the_devices_figures() -> None:
    [found] = attribute_measured(
        NOW, "n1", 0, reading(70, {}), [holder("w", (0, 1), 2.0, 500)], 5.0
    )
    assert (found.workload, found.utilization, found.share, found.source) == ("w", 70, 1.0, "nvml")
    assert (found.memory_used, found.power, found.temperature) == (30 * GIB, 250.0, 61.0)
    assert found.gpus_used == pytest.approx(0.7)


def test_a_shared_device_is_split_by_process_where_the_driver_tells() -> None:
    # Two half-GPU tasks: one uses 40% of the device (80% of its half), the other 10%.
    processes = {500: ProcessReading(10 * GIB, 40.0), 600: ProcessReading(4 * GIB, 10.0)}
    found = attribute_measured(
        NOW,
        "n1",
        3,
        reading(50, processes),
        [holder("a", (3,), 0.5, 500), holder("b", (3,), 0.5, 600)],
        5.0,
    )
    assert [(s.workload, s.utilization, s.memory_used) for s in found] == [
        ("a", 80.0, 10 * GIB),
        ("b", 20.0, 4 * GIB),
    ]
    assert sum(s.gpus_used for s in found) == pytest.approx(0.5)


def test_without_per_process_figures_the_device_is_split_by_share() -> None:
    processes = {500: ProcessReading(10 * GIB, None)}
    found = attribute_measured(
        NOW,
        "n1",
        3,
        reading(60, processes),
        [holder("a", (3,), 0.5, 500), holder("b", (3,), 0.25, 600)],
        5.0,
    )
    # 60% of the device over 0.75 of it held: each task at 80% of its own share.
    assert [(s.workload, s.utilization) for s in found] == [("a", 80.0), ("b", 80.0)]
    assert sum(s.gpus_used for s in found) == pytest.approx(0.6)
    assert [s.memory_used for s in found] == [10 * GIB, 0]


def test_a_free_device_is_nobodys_and_a_new_task_counts_from_its_start() -> None:
    [free] = attribute_measured(NOW, "n1", 0, reading(5, {}), [], 5.0)
    assert (free.workload, free.share, free.utilization) == (None, 0.0, 5)
    young = Holder("w", 0, (0,), 1.0, 500, NOW - 2.0)
    [sample] = attribute_measured(NOW, "n1", 0, reading(90, {}), [young], 5.0)
    assert sample.seconds == pytest.approx(2.0)


def test_declarations_count_while_fresh_and_only_for_their_task(tmp_path: Path) -> None:
    path = tmp_path / "task-0.util"
    assert read_declaration(str(path), NOW, NOW - 100, 30) == (0.0, 0)  # none yet
    path.write_text(json.dumps({"utilization": 85, "memory": 12 * GIB, "time": NOW - 10}))
    assert read_declaration(str(path), NOW, NOW - 100, 30) == (85.0, 12 * GIB)
    assert read_declaration(str(path), NOW + 25, NOW - 100, 30) == (0.0, 0)  # stale
    assert read_declaration(str(path), NOW, NOW - 5, 30) == (0.0, 0)  # a previous run's
    path.write_text("{not json")
    assert read_declaration(str(path), NOW, NOW - 100, 30) == (0.0, 0)


def test_virtual_devices_are_labelled_declared_or_none(tmp_path: Path) -> None:
    device = Device(1, "v-1", "virtual", 80 * GIB, True)
    path = tmp_path / "w.util"
    path.write_text(json.dumps({"utilization": 55, "memory": None, "time": NOW - 1}))
    [held] = attribute_declared(
        NOW, "n1", device, [holder("w", (1,), 1.0, 500, telemetry_file=str(path))], 5.0, 30
    )
    assert (held.source, held.utilization, held.share, held.power) == ("declared", 55, 1.0, None)
    [silent] = attribute_declared(NOW, "n1", device, [holder("q", (1,), 1.0, 501)], 5.0, 30)
    assert (silent.source, silent.utilization) == ("declared", 0.0)
    [free] = attribute_declared(NOW, "n1", device, [], 5.0, 30)
    assert (free.source, free.workload, free.memory_total) == ("none", None, 80 * GIB)


def test_a_sampler_samples_once_per_interval(tmp_path: Path) -> None:
    devices = (Device(0, "v-0", "virtual", GIB, True), Device(1, "v-1", "virtual", GIB, True))
    sampler = Sampler("n1", devices, 5.0)
    first = sampler.sample(NOW, [holder("w", (1,), 1.0, 500)])
    assert [(s.device, s.workload, s.seconds) for s in first] == [(0, None, 5.0), (1, "w", 5.0)]
    assert sampler.sample(NOW + 1, []) == []
    assert not sampler.due(NOW + 4.9) and sampler.due(NOW + 5)
    # A long silence is not filled in: a sample stands for three intervals at most.
    later = sampler.sample(NOW + 60, [])
    assert {s.seconds for s in later} == {15.0}


def test_report_utilization_writes_a_whole_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_TELEMETRY_FILE", raising=False)
    assert report_utilization(50) is False  # not under corral: nothing to do
    path = tmp_path / "run" / "w" / "task-0.util"
    monkeypatch.setenv("CORRAL_TELEMETRY_FILE", str(path))
    assert report_utilization(72.5, memory="3GiB") is True
    record = json.loads(path.read_text())
    assert (record["utilization"], record["memory"]) == (72.5, 3 * GIB)
    assert os.listdir(path.parent) == ["task-0.util"]  # no temporary file left
    with pytest.raises(ValueError, match="percent"):
        report_utilization(120)
    with pytest.raises(ValueError, match="memory"):
        report_utilization(10, memory="lots")
    assert json.loads(path.read_text())["utilization"] == 72.5  # unchanged by the failures


def test_the_sampling_interval_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CORRAL_SAMPLE_INTERVAL", raising=False)
    assert interval_from_env() == 5.0
    monkeypatch.setenv("CORRAL_SAMPLE_INTERVAL", "0.5")
    assert interval_from_env() == 0.5
    monkeypatch.setenv("CORRAL_SAMPLE_INTERVAL", "often")
    with pytest.raises(ValueError, match="CORRAL_SAMPLE_INTERVAL"):
        interval_from_env()
