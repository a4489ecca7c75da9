"""A workload's life on a real `corral up`: it runs as a real process, its output is read
through the logs API, and it ends Succeeded or Failed by its exit code, its retry policy,
a command that cannot start, or its maximum runtime."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import PYTHON, CorralUp, Servers, processes_of, running, wait_until


@pytest.fixture(scope="module")
def up(module_corral_up: Servers) -> Iterator[CorralUp]:
    yield module_corral_up(2, {"team": 2})


def test_a_workload_runs_its_output_is_in_the_logs_and_it_succeeds(up: CorralUp) -> None:
    script = "import os\nfor i in range(5): print(f'line {i} of', os.environ['CORRAL_WORKLOAD'])"
    up.submit("hello", "team", [PYTHON, "-c", script], gpu=1)
    done = up.wait_status("hello")
    assert done["status"] == "succeeded", done
    assert done["reason"] is None
    assert done["finished_at"] is not None and done["placements"] == []

    whole = up.logs("hello", 0)
    expected = "".join(f"line {i} of hello\n" for i in range(5))
    assert whole["text"] == expected
    assert whole["offset"] == len(expected)
    assert whole["tasks"] == [0]
    # Reading on from an offset gives only what follows; `tail` the last lines.
    assert up.logs("hello", 0, offset=len("line 0 of hello\n"))["text"] == expected[16:]
    assert up.logs("hello", 0, tail=2)["text"] == "line 3 of hello\nline 4 of hello\n"

    kinds = [event["kind"] for event in up.events("hello")]
    assert kinds == ["submitted", "bound", "task-started", "task-exited", "succeeded"]


def test_exit_code_3_is_retried_backoff_limit_times_then_fails(up: CorralUp) -> None:
    up.submit(
        "exits-3",
        "team",
        ["sh", "-c", "echo run attempt $CORRAL_ATTEMPT; exit 3"],
        gpu=1,
        backoff_limit=2,
    )
    done = up.wait_status("exits-3", timeout=60)
    assert done["status"] == "failed", done
    assert "exited with code 3" in done["reason"]
    assert done["attempts"] == 3

    # One run and the two retries: three runs, each in the log and in the events.
    runs = re.findall(r"^run attempt (\d+)$", up.log_text("exits-3"), re.M)
    assert runs == ["1", "2", "3"]
    assert len(up.events("exits-3", "task-started")) == 3
    retrying = up.events("exits-3", "retrying")
    assert len(retrying) == 2
    assert all("exited with code 3" in event["reason"] for event in retrying)
    failed = up.events("exits-3", "failed")
    assert len(failed) == 1 and "exited with code 3" in failed[0]["reason"]
    assert up.events("exits-3")[-1]["kind"] == "failed"


def test_a_missing_executable_fails_with_a_clear_reason(up: CorralUp) -> None:
    up.submit("missing", "team", ["corral-test-no-such-program", "--flag"], gpu=1)
    done = up.wait_status("missing")
    assert done["status"] == "failed", done
    assert len(up.events("missing", "task-started")) <= 1
    # The log says what happened...
    assert "corral-test-no-such-program" in up.log_text("missing")
    assert "No such file or directory" in up.log_text("missing")
    # ...and so must the workload's reason, which is what `corral get` shows: an exit
    # code of 127 alone does not tell a user that the program was not found.
    reason = done["reason"]
    assert re.search(r"not found|cannot start|could not start|no such file", reason, re.I), reason


def test_max_runtime_is_enforced(up: CorralUp) -> None:
    up.submit("sleeper", "team", ["sleep", "60"], gpu=1, max_runtime=2, grace_period=5)
    done = up.wait_status("sleeper", timeout=30)
    assert done["status"] == "failed", done
    assert "maximum runtime" in done["reason"]
    assert up.events("sleeper")[-1]["kind"] == "failed"
    assert "maximum runtime" in up.events("sleeper")[-1]["reason"]
    # The process was really stopped (and took no more than its grace period to go).
    [(_, pid)] = up.started_pids("sleeper")
    wait_until(lambda: not running(pid), 10, f"the sleeper's launcher {pid} to end")
    exit_file = up.data_dir / "run" / up.directory("sleeper") / "task-0.exit"
    assert exit_file.read_text().strip() == "143"  # SIGTERM: sleep does not catch it


STUBBORN = 'trap "echo ignoring TERM" TERM; echo started; while :; do sleep 0.2; done'


def test_max_runtime_kills_a_task_that_ignores_sigterm_after_its_grace_period(
    up: CorralUp,
) -> None:
    up.submit("stubborn", "team", ["sh", "-c", STUBBORN], gpu=1, max_runtime=2, grace_period=2)
    up.wait_log("stubborn", "started")
    # SIGTERM at 2 s, SIGKILL 2 s later: the generous timeout is for a loaded machine, far
    # below the 30 s default grace period that the workload did not ask for.
    done = up.wait_status("stubborn", timeout=10)
    assert done["status"] == "failed", done
    assert "maximum runtime" in done["reason"]
    assert "ignoring TERM" in up.log_text("stubborn")
    [(_, pid)] = up.started_pids("stubborn")
    assert not running(pid)


def test_deleting_a_running_workload_terms_then_kills_its_group(up: CorralUp) -> None:
    script = f'mkdir -p "$CORRAL_CHECKPOINT_DIR"; touch "$CORRAL_CHECKPOINT_DIR/state"; {STUBBORN}'
    up.submit("deleted", "team", ["sh", "-c", script], gpu=1, grace_period=2)
    up.wait_log("deleted", "started")
    [(_, pid)] = up.started_pids("deleted")
    assert running(pid)
    directory = up.directory("deleted")
    log = up.data_dir / "logs" / directory / "task-0.log"
    files = [log.parent, up.data_dir / "run" / directory, up.workloads_dir / directory]
    assert all(path.exists() for path in files), files
    with up.client() as client:
        assert client.delete("/workloads/deleted").status_code == 204
    # SIGTERM first (it says so in its grace period), then SIGKILL.
    wait_until(lambda: "ignoring TERM" in _text(log), 10, "the task to be sent SIGTERM")
    wait_until(lambda: not running(pid), 10, "the deleted workload's processes to be killed")
    # The whole group went: nothing of the workload is left, and once it has gone, nor is
    # what it left on disk: its log, its exit code, its own directory with its checkpoint.
    wait_until(lambda: pid not in groups_of(up.data_dir), 10, "the rest of its group to go")
    wait_until(lambda: not any(path.exists() for path in files), 10, "its files to go")


def test_cancelling_keeps_what_the_workload_left_and_deleting_removes_it(up: CorralUp) -> None:
    script = 'mkdir -p "$CORRAL_CHECKPOINT_DIR"; touch "$CORRAL_CHECKPOINT_DIR/state"; echo hi'
    up.submit("kept", "team", ["sh", "-c", script], gpu=1, max_runtime=60)
    assert up.wait_status("kept")["status"] == "succeeded"
    directory = up.directory("kept")
    files = [
        up.data_dir / "logs" / directory / "task-0.log",
        up.data_dir / "run" / directory / "task-0.exit",
        up.workloads_dir / directory / "checkpoints" / "state",
    ]
    assert all(path.exists() for path in files), files
    # A workload that ended keeps its record, and with it its files, until it is deleted.
    with up.client() as client:
        assert [row["name"] for row in client.get("/history").json()].count("kept") == 1
        assert client.delete("/workloads/kept").status_code == 204
    wait_until(lambda: not any(path.exists() for path in files), 10, "its files to go")
    assert not (up.workloads_dir / directory).exists()


def _text(path: Path) -> str:
    """What a file holds, or nothing when it is not there (any more)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def groups_of(data_dir: Path) -> set[int]:
    groups = set()
    for process in processes_of(data_dir):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(process))
    return groups
