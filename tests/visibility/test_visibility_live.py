"""Telemetry, rules, usage and /metrics on a real `corral up` with virtual GPUs, sampling
every half second.

Two interactive notebooks share a project whose rule suspends build work idle for 6 s:
one declares 0% through corral.sdk.report_utilization, the other 80%. Only the first is
suspended, with an event that says why; the API, the CLI and /metrics then agree.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from livecorral import CORRAL, PYTHON, CorralUp, wait_until

DECLARE = """
import sys, time
from corral.sdk import report_utilization
while True:
    report_utilization(float(sys.argv[1]), memory="2GiB")
    time.sleep(0.3)
"""
IDLE_REASON = "GPUs idle for 6s (rule of queue lab for build work)"
SAMPLE_INTERVAL = 0.5


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralUp]:
    server = CorralUp(tmp_path_factory.mktemp("visibility") / "corral", gpus=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORRAL_SAMPLE_INTERVAL", str(SAMPLE_INTERVAL))
        server.start()
    try:
        server.post(
            "/queues",
            {"name": "lab", "deserved": 2, "rules": {"interactive": {"idle_timeout": 6}}},
        )
        # The busy one first, declaring itself before the quiet one starts: from then on
        # both hold a GPU until the quiet one is suspended, 6 s idle later, however slowly
        # a loaded machine started them.
        for name, percent in (("busy", 80), ("quiet", 0)):
            server.submit(
                name, "lab", [PYTHON, "-c", DECLARE, str(percent)], gpu=1, priority="interactive"
            )
            server.wait_status(name, "running", timeout=40)
            if name == "busy":
                wait_until(
                    lambda: server.get("/telemetry/workloads/busy", since=60)["series"],
                    40,
                    "the busy notebook's first declared sample",
                )
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def settled(up: CorralUp) -> CorralUp:
    """The server once the idle notebook was suspended."""
    up.wait_status("quiet", "suspended", timeout=40)
    # A few more samples of the busy one alone, so that what follows reads a steady state.
    time.sleep(1.5)
    return up


def metrics(up: CorralUp) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{up.url}/metrics", timeout=10)  # no token: Prometheus scrapes
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_an_idle_notebook_is_suspended_and_a_busy_one_is_not(settled: CorralUp) -> None:
    quiet = settled.workload("quiet")
    assert quiet["reason"] == IDLE_REASON and quiet["placements"] == []
    [event] = settled.events("quiet", "suspended")
    assert (event["cause"], event["reason"]) == ("idle-timeout", IDLE_REASON)
    busy = settled.workload("busy")
    assert busy["status"] == "running"
    # It has run longer than the timeout, busy all along.
    assert time.time() - busy["started_at"] > 6
    assert settled.events("busy", "suspended") == []

    samples = settled.get("/telemetry/workloads/busy", since=60)["series"]
    assert samples and {s["source"] for s in samples} == {"declared"}
    assert samples[-1]["utilization"] == 80 and samples[-1]["memory_used"] == 2 << 30
    quiet_samples = settled.get("/telemetry/workloads/quiet", since=60)["series"]
    assert quiet_samples and {s["utilization"] for s in quiet_samples} == {0}


def test_devices_show_who_holds_them_and_how_busy_they_are(settled: CorralUp) -> None:
    devices = {d["device"]: d for d in settled.get("/telemetry/devices")}
    busy_device = settled.workload("busy")["placements"][0]["devices"][0]
    held = devices[busy_device]
    assert (held["workloads"], held["state"], held["source"]) == (["lab/busy"], "busy", "declared")
    assert held["utilization"] == 80 and held["virtual"] is True
    free = devices[1 - busy_device]
    assert (free["workloads"], free["state"], free["source"]) == ([], "free", "none")


def test_metrics_agree_with_the_api(settled: CorralUp) -> None:
    scraped = metrics(settled)
    node = settled.node

    def value(name: str, **labels: str) -> float:
        return scraped[(name, tuple(sorted(labels.items())))]

    [node_out] = settled.get("/nodes")
    assert value("corral_node_gpus", node=node) == node_out["gpus"] == 2
    assert value("corral_node_gpus_allocated", node=node) == node_out["allocated_gpu"] == 1
    devices = settled.get("/telemetry/devices")
    used = sum(d["utilization"] for d in devices if d["workloads"]) / 100
    assert value("corral_node_gpus_used", node=node) == pytest.approx(used) == pytest.approx(0.8)
    assert value("corral_project_gpus_allocated", project="lab") == 1
    assert value("corral_project_gpus_used", project="lab") == pytest.approx(0.8)

    [lab] = settled.get("/queues")
    assert value("corral_queue_deserved_gpus", queue="lab") == lab["deserved"]["gpu"]
    assert value("corral_queue_fair_share_gpus", queue="lab") == lab["fair_share"]["gpu"]
    assert value("corral_queue_allocated_gpus", queue="lab") == lab["allocated"]["gpu"] == 1
    assert value("corral_queue_pending_gpus", queue="lab") == lab["pending_gpu"] == 0

    counts = settled.get("/cluster")["workloads"]
    for status, count in counts.items():
        assert value("corral_workloads", status=status) == count
    assert counts["running"] == 1 and counts["suspended"] == 1

    assert value("corral_preemptions_total", reason="idle_timeout") == 1
    cycles = value("corral_scheduler_cycle_seconds_count")
    assert cycles >= 2
    assert value("corral_scheduler_cycle_seconds_bucket", le="+Inf") == cycles
    assert value(
        "corral_device_utilization_percent",
        node=node,
        device=str(settled.workload("busy")["placements"][0]["devices"][0]),
        source="declared",
    ) == pytest.approx(80)


def test_usage_from_the_api_and_the_cli(settled: CorralUp) -> None:
    rows = {row["key"]: row for row in settled.get("/usage", since="1h", by="workload")}
    # By workload, each is PROJECT/NAME: names are unique only within a project.
    assert set(rows) == {"lab/quiet", "lab/busy"}
    busy, quiet = rows["lab/busy"], rows["lab/quiet"]
    assert busy["gpu_hours_used"] > 0 and quiet["gpu_hours_used"] == 0
    assert quiet["gpu_hours_idle"] > 0
    # 6 s idle before the suspension, and its first sample at the latest half a second on.
    assert 5 / 3600 < quiet["gpu_hours_idle"] <= quiet["gpu_hours_allocated"] < 20 / 3600
    # The busy notebook at 80%, from its first declaration on (its start-up counts as 0%).
    held = busy["gpu_hours_allocated"]
    assert 0.5 * held < busy["gpu_hours_used"] <= 0.8 * held + 1e-5

    # The busy notebook keeps running, so its GPU-hours grow between two reads: the CLI's
    # figures may exceed the API's by one GPU for the time between (plus the 6-digit rounding).
    read_at = time.monotonic()
    with settled.client() as client:
        text = client.get("/usage", params={"since": "1h", "by": "project", "format": "csv"})
    assert text.headers["content-type"].startswith("text/csv")
    [row] = list(csv.DictReader(io.StringIO(text.text)))
    assert row["key"] == "lab"
    allocated = float(row["gpu_hours_allocated"])
    assert allocated == pytest.approx(
        busy["gpu_hours_allocated"] + quiet["gpu_hours_allocated"], abs=0.001
    )

    env = {**os.environ, "CORRAL_SERVER": settled.url, "CORRAL_TOKEN": settled.token}
    env["XDG_CONFIG_HOME"] = str(settled.data_dir / "config")
    done = subprocess.run(
        [CORRAL, "report", "usage", "--since", "1h", "--by", "project", "--csv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    [cli_row] = list(csv.DictReader(io.StringIO(done.stdout)))
    assert cli_row["key"] == "lab"
    grown = (time.monotonic() - read_at) / 3600 + 2e-6
    assert allocated - 2e-6 <= float(cli_row["gpu_hours_allocated"]) <= allocated + grown
    # Used grows by the samples written between the reads, and each stands for the
    # interval before it: some of that may precede the API's read.
    used = float(row["gpu_hours_used"])
    assert used - 2e-6 <= float(cli_row["gpu_hours_used"]) <= used + grown + SAMPLE_INTERVAL / 3600

    table = subprocess.run(
        [CORRAL, "report", "usage", "--since", "1h", "--by", "user"],
        env={**env, "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0, table.stderr
    assert "admin" in table.stdout and "used %" in table.stdout

    bad = subprocess.run(
        [CORRAL, "report", "usage", "--since", "soon"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_series_of_the_cluster_and_its_queues(settled: CorralUp) -> None:
    [suspended] = settled.events("quiet", "suspended")
    at = suspended["time"]
    started = max(settled.workload(name)["started_at"] for name in ("quiet", "busy"))
    time.sleep(max(0.0, at + 11 - time.time()))
    window = {"since": 40, "step": 2, "until": at + 10}
    cluster = settled.get("/telemetry/cluster", **window)
    points = cluster["series"]
    assert len(points) == 20 and cluster["step"] == 2 and cluster["until"] == at + 10
    assert {p["gpus"] for p in points} == {2}
    # Both notebooks held a GPU, one at 80%, one at 0%, from a little after the quiet one
    # started (the busy one had declared itself before) until it was suspended.
    both = [p for p in points if p["time"] > started + 0.5 and p["time"] + 2 < at - 0.5]
    assert both
    for point in both:
        assert point["allocated"] == pytest.approx(2.0, abs=0.01)
        assert point["used"] == pytest.approx(0.8, abs=0.1)
    # Then the busy one alone.
    alone = [p for p in points if p["time"] > at + 0.5]
    assert alone
    for point in alone:
        assert point["allocated"] == pytest.approx(1.0, abs=0.01)
        assert point["used"] == pytest.approx(0.8, abs=0.1)
    queues = settled.get("/telemetry/queues", **window)
    assert set(queues["series"]) == {"lab"}
    lab = queues["series"]["lab"]
    assert {p["deserved"] for p in lab} == {2}
    assert [p["time"] for p in lab] == [p["time"] for p in points]
    assert [p["allocated"] for p in lab] == [p["allocated"] for p in points]


def test_bad_requests_name_the_field(settled: CorralUp) -> None:
    with settled.client() as client:
        checks: list[tuple[str, dict[str, Any], list[str]]] = [
            ("/usage", {"since": "soon"}, ["query", "since"]),
            ("/usage", {"by": "team"}, ["query", "by"]),
            ("/usage", {"format": "xml"}, ["query", "format"]),
            ("/telemetry/cluster", {"since": "7d", "step": 1}, ["query", "step"]),
        ]
        for path, params, loc in checks:
            response = client.get(path, params=params)
            assert response.status_code == 422, response.text
            assert [item["loc"] for item in response.json()["detail"]] == [loc], response.text
        response = client.post(
            "/queues", json={"name": "rules-bad", "rules": {"interactive": {"idle_timeout": "x"}}}
        )
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == [
            "body",
            "rules",
            "interactive",
            "idle_timeout",
        ]
        response = client.post(
            "/queues", json={"name": "rules-bad", "rules": {"build": {}, "interactive": {}}}
        )
        assert response.status_code == 422
        assert client.get("/queues/rules-bad").status_code == 404  # nothing was written
        assert client.get("/telemetry/workloads/never-was").status_code == 404
        viewer = client.post("/users", json={"name": "vera", "role": "viewer"}).json()["token"]
        patched = client.patch("/queues/lab", json={"rules": {"train": {"max_runtime": "2d"}}})
        assert patched.status_code == 200
        assert patched.json()["rules"] == {"train": {"idle_timeout": None, "max_runtime": 172800}}
        client.patch("/queues/lab", json={"rules": {"interactive": {"idle_timeout": 6}}})
    assert httpx.get(f"{settled.url}/api/v1/usage", timeout=10).status_code == 401
    as_viewer = httpx.get(
        f"{settled.url}/api/v1/usage", headers={"Authorization": f"Bearer {viewer}"}, timeout=10
    )
    assert as_viewer.status_code == 200


def test_a_reused_name_shows_none_of_the_deleted_workloads_samples(settled: CorralUp) -> None:
    # Last in the module: it deletes the quiet notebook, whose samples it had.
    assert settled.get("/telemetry/workloads/quiet", since=600)["series"]
    with settled.client() as client:
        assert client.delete("/workloads/quiet").status_code == 204
    # The same name again, in a place it never runs: no sample is its own.
    settled.submit("quiet", "lab", ["true"], gpu=1, node_selector={"rack": "nowhere"})
    assert settled.get("/telemetry/workloads/quiet", since=600)["series"] == []
