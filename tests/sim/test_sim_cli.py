"""`corral simulate`, run as users run it: the installed console script in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.sim.report import duration

CORRAL = Path(sys.executable).parent / "corral"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sim-synthetic.yaml"
POLICIES = ("corral", "static", "fifo")


def corral(*args: str | Path) -> subprocess.CompletedProcess[str]:
    # Wide and colourless, so that table cells are not wrapped or split by escape codes.
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [str(CORRAL), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("report")
    policies = [arg for name in POLICIES for arg in ("--policy", name)]
    done = corral(
        "simulate", EXAMPLE, "--trace", "synthetic", "--jobs", "150", *policies, "--out", out
    )
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def test_prints_the_policies_side_by_side(report: tuple[Path, str]) -> None:
    _, stdout = report
    header = next(line for line in stdout.splitlines() if "corral" in line and "fifo" in line)
    assert header.index("corral") < header.index("static") < header.index("fifo")
    assert "queueing delay, p95" in stdout


def test_writes_the_report_files(report: tuple[Path, str]) -> None:
    out, _ = report
    for name in ("report.json", "report.md"):
        assert (out / name).stat().st_size > 0
    for name in ("allocation.png", "queueing_delay.png", "usage_vs_quota.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_numbers_agree(report: tuple[Path, str]) -> None:
    out, _ = report
    document = json.loads((out / "report.json").read_text())
    markdown = (out / "report.md").read_text()
    assert list(document["policies"]) == list(POLICIES)
    window = document["trace"]["window_hours"]
    for policy in document["policies"].values():
        projects = policy["projects"].values()
        assert sum(p["jobs"] for p in projects) == policy["jobs"] == 150
        assert sum(p["completed"] for p in projects) == policy["completed"]
        assert sum(p["gpu_hours"] for p in projects) == pytest.approx(policy["gpu_hours"], 1e-4)
        # Allocation is the projects' mean GPUs over the cluster's GPUs.
        mean_gpus = sum(p["mean_gpus"] for p in projects)
        assert policy["allocation"] == pytest.approx(mean_gpus / policy["gpus"], 1e-4)
        assert sum(policy["evictions_by_action"].values()) == policy["preemptions"]
        assert sum(p["preemptions"] for p in projects) == policy["preemptions"]
        delay = policy["queueing_delay"]
        assert delay["p50"] <= delay["p95"] <= delay["p99"]
        assert delay["count"] == policy["jobs"]
        # The sampled series covers the run: its points average close to the allocation.
        series = policy["series"]
        assert len(series["allocation"]) == len(series["start_hours"])
        inside = [
            a
            for a, t in zip(series["allocation"], series["start_hours"], strict=True)
            if t < window
        ]
        assert sum(inside) / len(inside) == pytest.approx(policy["allocation"], abs=0.03)
        # The Markdown shows the same figures.
        assert duration(delay["p95"]) in markdown
    assert "| queueing delay, p95 |" in markdown
    assert "![usage vs quota](usage_vs_quota.png)" in markdown


def test_missing_trace_file(tmp_path: Path) -> None:
    done = corral("simulate", EXAMPLE, "--trace", tmp_path / "nothing.csv")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"{tmp_path / 'nothing.csv'}: no such file, and not a trace name "
        "(philly, gavel, openb, openb:VARIANT, helios, synthetic)"
    ]


def test_absent_trace_column(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("timestamp,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,1,66,team-a\n")
    done = corral("simulate", EXAMPLE, "--trace", trace)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "jobs.csv: column 'duration' is absent (it has timestamp, num_gpus, gpu_time, cluster)"
    )


def test_unknown_trace_format(tmp_path: Path) -> None:
    trace = tmp_path / "other.csv"
    trace.write_text("a,b\n1,2\n")
    done = corral("simulate", EXAMPLE, "--trace", trace)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("other.csv: not a known trace format")


def test_absent_column_of_a_named_trace_format(tmp_path: Path) -> None:
    # An openb pod list without its time columns cannot be replayed.
    folder = tmp_path / "alibaba"
    folder.mkdir()
    nodes = folder / "openb_node_list_gpu_node.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,V100M32\n")
    pods = folder / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,1000\n")
    done = corral("simulate", EXAMPLE, "--trace", pods)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("pods.csv: columns 'creation_time', 'deletion_time', ")


def test_project_without_a_queue(tmp_path: Path) -> None:
    scenario = tmp_path / "three.yaml"
    scenario.write_text(
        "name: three\nnodes: [{name: n0, gpus: 8}]\n"
        "queues: [{name: team-a, deserved: 2}, {name: team-b, deserved: 2},"
        " {name: team-c, deserved: 2}]\n"
    )
    done = corral("simulate", scenario, "--trace", "synthetic")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f'{scenario}: trace project "team-d" has no queue (leaf queues: team-a, team-b, team-c)'
    )


def test_unknown_policy() -> None:
    done = corral("simulate", EXAMPLE, "--trace", "synthetic", "--policy", "fastest")
    assert done.returncode == 2
    assert done.stderr.strip().startswith('--policy: unknown policy "fastest" (policies: corral,')
