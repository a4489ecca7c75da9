"""A real agent fed launches the API would refuse (they may still come from an older
server, a hand-written client of the transport, or a user account removed since): each is
that task's failure, reported with its reason, while the task beside it runs on and the
heartbeat goes on. No mocks: real processes, a real agent, a recorder of its reports."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from livecorral import remove_walls, running, wait_until

from corral.agent import Agent
from corral.agent.telemetry import read_declaration
from corral.messages import FENCED, STOPPED, TaskLaunch, TaskStop
from corral.model.telemetry import Sample

ROOT = os.geteuid() == 0


class Recorder:
    """What the agent reports, kept for the test to look at."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[str, int] = {}
        self.ended: dict[str, tuple[int | None, str]] = {}
        self.causes: dict[str, str | None] = {}
        self.heartbeats = 0

    def task_started(self, node: str, workload: str, task: int, pid: int, proc_start: int) -> None:
        with self.lock:
            self.started[workload] = pid

    def task_ended(
        self,
        node: str,
        workload: str,
        task: int,
        exit_code: int | None,
        reason: str,
        attempt: int | None = None,
        launch: int | None = None,
        cause: str | None = None,
        directory: str | None = None,
    ) -> None:
        with self.lock:
            self.ended[workload] = (exit_code, reason)
            self.causes[workload] = cause

    def heartbeat(self, node: str) -> None:
        with self.lock:
            self.heartbeats += 1

    def samples(self, node: str, samples: list[Sample]) -> None:
        pass

    def checkpoints(self, node: str, times: Mapping[str, float]) -> None:
        pass


def launch(name: str, command: list[str], **more: object) -> TaskLaunch:
    fields: dict[str, object] = {"unix_user": "root"} if ROOT else {}
    fields.update(more)
    return TaskLaunch(
        workload=name,
        project="p",
        task=0,
        attempt=0,
        node="n",
        devices=(),
        gpu=0,
        command=tuple(command),
        **fields,  # type: ignore[arg-type]
    )


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, Recorder]]:
    workloads = Path(tempfile.mkdtemp(prefix="corral-robust-"))
    recorder = Recorder()
    agent = Agent(
        "n",
        tmp_path / "data",
        reports=recorder,
        heartbeat_interval=0.0,
        poll_interval=0.05,
        workloads_dir=workloads,
    )
    agent.start_thread()
    yield agent, recorder
    agent.close()
    for pid in recorder.started.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    remove_walls(tmp_path / "data")
    shutil.rmtree(workloads, ignore_errors=True)


def test_launches_that_cannot_start_fail_alone(agent: tuple[Agent, Recorder]) -> None:
    worker, recorder = agent
    worker.start([launch("steady", ["sleep", "60"])])
    pid = wait_until(lambda: recorder.started.get("steady"), 20, "steady to start")
    bad = {
        "nul-argv": launch("nul-argv", ["sh", "-c", "echo \x00"]),
        "nul-env": launch("nul-env", ["true"], env={"A": "x\x00y"}),
        "eq-env": launch("eq-env", ["true"], env={"A=B": "x"}),
        "nul-workdir": launch("nul-workdir", ["true"], workdir="/tmp\x00x"),
        "no-command": launch("no-command", []),
    }
    if ROOT:
        bad["no-account"] = launch("no-account", ["true"], unix_user=None)
        bad["gone-account"] = launch("gone-account", ["true"], unix_user="corral-no-such")
    # Neither start nor stop raises (they run a tick: a raise would reach the API's caller,
    # a DELETE say, as a 500), whatever the launches hold.
    worker.start(list(bad.values()))
    worker.stop([TaskStop(name, "n", (0,), "deleted", 0.0) for name in bad])
    wait_until(lambda: set(bad) <= set(recorder.ended), 20, "every bad launch to be reported")
    for name in bad:
        code, reason = recorder.ended[name]
        assert code is None and reason, (name, code, reason)
        assert name not in recorder.started, name
    assert "no command" in recorder.ended["no-command"][1]
    if ROOT:
        assert "no Unix account" in recorder.ended["no-account"][1]
        assert "corral-no-such" in recorder.ended["gone-account"][1]
    # The steady task runs on, untouched, and the agent still beats and still starts work.
    assert running(pid) and "steady" not in recorder.ended
    beats = recorder.heartbeats
    wait_until(lambda: recorder.heartbeats > beats + 3, 10, "more heartbeats")
    worker.start([launch("after", ["true"])])
    wait_until(lambda: recorder.ended.get("after"), 20, "a later task to run")
    assert recorder.ended["after"] == (0, "exited with code 0")
    assert worker.running() == {("steady", 0)}


def test_a_stop_decided_before_a_launch_leaves_that_launch_running(
    agent: tuple[Agent, Recorder],
) -> None:
    # Orders may arrive out of order (see corral.messages): a stop decided at 6 is older
    # than a launch decided at 7, so it was meant for an earlier binding of the task.
    worker, recorder = agent
    worker.start([launch("again", ["sleep", "60"], decided_at=7.0)])
    worker.start([launch("unknown", ["sleep", "60"])])
    pid = wait_until(lambda: recorder.started.get("again"), 20, "again to start")
    wait_until(lambda: recorder.started.get("unknown"), 20, "unknown to start")
    worker.stop([TaskStop("again", "n", (0,), "stale", 0.0, 6.0)])
    # A launch of unknown time (an older server's) is stopped by any stop.
    worker.stop([TaskStop("unknown", "n", (0,), "any", 0.0, 6.0)])
    wait_until(lambda: recorder.ended.get("unknown"), 20, "unknown to be stopped")
    assert recorder.ended["unknown"][1] == "any"
    assert running(pid) and "again" not in recorder.ended
    # Decided with the launch or after it: it stops.
    worker.stop([TaskStop("again", "n", (0,), "current", 0.0, 7.0)])
    wait_until(lambda: recorder.ended.get("again"), 20, "again to be stopped")
    assert recorder.ended["again"][1] == "current"


def test_an_end_says_whether_corral_caused_it(agent: tuple[Agent, Recorder]) -> None:
    # A task that ends by itself, one the server stops, and, when the server declares the
    # node lost at 50, one launched before (killed at once) and one after (left alone).
    worker, recorder = agent
    worker.start(
        [
            launch("own", ["sh", "-c", "exit 3"], decided_at=100.0),
            launch("stopped", ["sleep", "60"], decided_at=100.0),
            launch("before", ["sleep", "60"], decided_at=10.0),
            launch("after", ["sleep", "60"], decided_at=100.0),
        ]
    )
    wait_until(lambda: len(recorder.started) == 4, 20, "the four starts")
    worker.stop([TaskStop("stopped", "n", (0,), "preempted", 5.0)])
    assert worker.fence(50.0, "fenced: the server declared node n lost") == 1
    wait_until(lambda: {"own", "stopped", "before"} <= set(recorder.ended), 20, "three ends")
    assert recorder.ended["own"] == (3, "exited with code 3") and recorder.causes["own"] is None
    assert recorder.ended["stopped"][1] == "preempted" and recorder.causes["stopped"] == STOPPED
    assert recorder.ended["before"] == (137, "fenced: the server declared node n lost")
    assert recorder.causes["before"] == FENCED
    assert worker.running() == {("after", 0)} and running(recorder.started["after"])
    # Fencing again at the same time kills nothing more.
    assert worker.fence(50.0, "fenced: again") == 0


def test_a_task_cannot_stall_the_agent_with_its_telemetry_file(tmp_path: Path) -> None:
    # The file is the task's: a FIFO would block a plain open(), a symlink would make the
    # agent read another file.
    fifo = tmp_path / "task-0.util"
    os.mkfifo(fifo)
    began = time.monotonic()
    assert read_declaration(str(fifo), time.time(), 0, 60) == (0.0, 0)
    assert time.monotonic() - began < 1
    link = tmp_path / "link.util"
    target = tmp_path / "real.util"
    target.write_text(f'{{"time": {time.time()}, "utilization": 50}}')
    link.symlink_to(target)
    assert read_declaration(str(link), time.time(), 0, 60) == (0.0, 0)
    assert read_declaration(str(target), time.time(), 0, 60) == (50.0, 0)


# Asked to stop, it writes a last checkpoint in its grace period.
CHECKPOINTS_ON_TERM = (
    'mkdir -p "$CORRAL_CHECKPOINT_DIR"; '
    "trap 'sleep 0.5; echo last > \"$CORRAL_CHECKPOINT_DIR/state\"; exit 0' TERM; "
    "echo started; while :; do sleep 0.05; done"
)


def test_a_deleted_workloads_files_go_once_its_task_has_and_it_starts_no_more(
    agent: tuple[Agent, Recorder],
) -> None:
    worker, recorder = agent
    deleted = launch("gone", ["sh", "-c", CHECKPOINTS_ON_TERM], directory="gone.7", grace=5.0)
    worker.start([deleted])
    log = worker.log_path("gone.7", 0)
    wait_until(lambda: log.exists() and "started" in log.read_text(), 20, "the task to start")
    files = [log.parent, worker.exit_path("gone.7", 0).parent, worker.workloads_dir / "gone.7"]
    worker.stop([TaskStop("gone", "n", (0,), "deleted", 5.0)])
    worker.forget("gone.7")
    # In its grace period its files stay: it may still be checkpointing.
    assert all(path.exists() for path in files), files
    wait_until(lambda: "gone" in recorder.ended, 20, "the task to end")
    assert recorder.ended["gone"] == (0, "deleted")
    worker.tick()
    assert not any(path.exists() for path in files), files
    # A launch of it delivered late (decided before it was deleted) starts nothing.
    worker.start([deleted])
    assert worker.running() == set()
    # Nothing of another workload, nor of its own name under another id, went with it.
    worker.forget("gone.8")
    worker.forget("../escape")
    worker.start([launch("gone", ["true"], directory="gone.9")])
    wait_until(lambda: worker.running() == set(), 20, "the later workload's task to end")
    assert worker.log_path("gone.9", 0).exists()
