"""`corral plan FILE`, run as users run it: the installed console script in a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app

CORRAL = Path(sys.executable).parent / "corral"

CLUSTER = """
name: cli
description: One node with one GPU.
nodes: [{name: node0, gpus: 1}]
queues: [{name: q, deserved: 1}]
workloads:
  - {name: small, queue: q, priority: build, tasks: 1x1}
  - {name: big, queue: q, priority: build, tasks: 1x2}
"""


def corral(*args: str | Path) -> subprocess.CompletedProcess[str]:
    # Wide and colourless, so that table cells are not wrapped or split by escape codes.
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [str(CORRAL), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


class Writer:
    """Writes scenario text to S.yaml in a test's temporary directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, text: str) -> Path:
        path = self.directory / "S.yaml"
        path.write_text(text)
        return path


@pytest.fixture
def write(tmp_path: Path) -> Writer:
    return Writer(tmp_path)


def test_no_expectations_exits_0(write: Writer) -> None:
    done = corral("plan", write(CLUSTER))
    assert done.returncode == 0, done.stderr
    assert "small" in done.stdout
    assert "big" in done.stdout
    assert "No expectations to check." in done.stdout
    assert done.stderr == ""


def test_expectations_that_hold_exit_0(write: Writer) -> None:
    path = write(CLUSTER + "expect:\n  running: {small: node0}\n  pending: [big]\n")
    done = corral("plan", path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All expectations hold." in done.stdout


def test_a_failed_expectation_exits_1_and_says_which(write: Writer) -> None:
    path = write(CLUSTER + "expect:\n  running: {small: node0, big: node0}\n")
    done = corral("plan", path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 expectation failed:" in done.stdout
    assert "big: expected running on node0, but it is pending" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_json_prints_only_the_documented_document(write: Writer) -> None:
    done = corral("plan", write(CLUSTER), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document) == {"cycles", "workloads", "evictions", "queues"}
    assert isinstance(document["cycles"], int)
    assert document["cycles"] >= 1
    assert list(document["workloads"]) == ["small", "big"]
    assert document["workloads"]["small"] == {
        "status": "running",
        "nodes": ["node0"],
        "gpus": [[0]],
    }
    big = document["workloads"]["big"]
    assert set(big) == {"status", "reason"}
    assert big["status"] == "pending"
    assert isinstance(big["reason"], str)
    assert document["evictions"] == []
    queue = document["queues"]["q"]
    assert set(queue) == {"deserved", "fair_share", "allocated"}
    assert queue["deserved"] == 1
    assert isinstance(queue["deserved"], int)
    assert queue["allocated"] == 1


def test_time_decayed_weights_are_shown_where_the_policy_is_on(write: Writer) -> None:
    on = CLUSTER.replace(
        "queues: [{name: q, deserved: 1}]",
        "queues: [{name: q, deserved: 1, fair_share_half_life: 1h, usage: 0.5},"
        " {name: r, deserved: 0}]",
    )
    done = corral("plan", write(on), "--json")
    assert done.returncode == 0, done.stderr
    queues = json.loads(done.stdout)["queues"]
    # q alone used GPU-time among its siblings: 1 + (1 - 2 * 1) = 0. r has the policy off.
    assert queues["q"]["weight"] == 0
    assert "weight" not in queues["r"]
    done = corral("plan", write(on))
    header = next(line for line in done.stdout.splitlines() if "fair share" in line)
    assert "weight" in header
    assert "weight" not in corral("plan", write(CLUSTER)).stdout


def test_json_with_a_failed_expectation_keeps_stdout_pure(write: Writer) -> None:
    path = write(CLUSTER + "expect:\n  running: {small: node0, big: node0}\n")
    done = corral("plan", "--json", path)
    assert done.returncode == 1
    assert json.loads(done.stdout)["workloads"]["big"]["status"] == "pending"
    assert "expectation failed: big: expected running on node0" in done.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            CLUSTER.replace("tasks: 1x2", "tasks: 2xA"),
            'workloads[1].tasks: "2xA" is not REPLICASxGPUS',
        ),
        (CLUSTER + "expect:\n  pending: [ghost]\n", 'expect.pending[0]: unknown workload "ghost"'),
        ("name: x\nnodes: [{name: node0\n", "line 3, column 1: invalid YAML"),
        ("- 1\n- 2\n", "a scenario must be a mapping"),
    ],
    ids=["bad-field", "unknown-workload", "yaml-syntax", "not-a-mapping"],
)
def test_an_invalid_file_exits_2_with_one_line(write: Writer, text: str, message: str) -> None:
    path = write(text)
    done = corral("plan", path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(f"{path}: {message}"), done.stderr
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    done = corral("plan", path)
    assert done.returncode == 2
    assert done.stderr == f"{path}: cannot read the file: No such file or directory\n"


def test_debug_shows_the_traceback(write: Writer) -> None:
    done = corral("--debug", "plan", write("- 1\n"))
    assert done.returncode != 0
    assert "Traceback" in done.stderr
    assert "ScenarioError" in done.stderr


def test_help_lists_plan() -> None:
    done = corral("--help")
    assert done.returncode == 0
    assert "plan" in done.stdout
    assert "--debug" in done.stdout


def test_an_internal_error_is_one_line_and_exit_3(
    write: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In process, because a crash cannot be provoked through the installed script.
    def broken(scenario: object) -> None:
        raise RuntimeError("the engine fell over")

    monkeypatch.setattr("corral.scenario.plan", broken)
    done = CliRunner().invoke(app, ["plan", str(write(CLUSTER))])
    assert done.exit_code == 3
    assert done.output == (
        "internal error: RuntimeError: the engine fell over "
        "(run with corral --debug to see the traceback)\n"
    )
