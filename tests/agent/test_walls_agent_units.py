"""A real agent's cgroups where no process namespace ends a task's processes with it (a
kernel that refuses one): what a task left behind is killed before its end is reported,
after a restart too, and a stray's leftovers before its task starts again. Real
processes, real cgroups, as root (skipped without, except under CI=true)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import running, wait_until
from test_agent_robust_units import Recorder, launch

from corral.agent import Agent
from corral.agent.walls import WallOptions, Walls
from corral.messages import TaskStop

LEAVE = "setsid sleep 300 & echo left $!; exec sleep 300"


class Witness(Recorder):
    """A recorder that looks, as each start and end is reported, whether the processes it
    is told of still run."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: list[int] = []
        self.alive_at: dict[tuple[str, str], list[int]] = {}

    def task_started(self, node: str, workload: str, task: int, pid: int, start: int) -> None:
        self.alive_at[("start", workload)] = [p for p in self.watched if running(p)]
        super().task_started(node, workload, task, pid, start)

    def task_ended(self, node: str, workload: str, *rest: object, **more: object) -> None:
        self.alive_at[("end", workload)] = [pid for pid in self.watched if running(pid)]
        super().task_ended(node, workload, *rest, **more)  # type: ignore[arg-type]


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root, and these tests need cgroups")
        pytest.skip("cgroups need root")
    workloads = Path(tempfile.mkdtemp(prefix="corral-walls-units-"))
    yield tmp_path / "data", workloads
    shutil.rmtree(workloads, ignore_errors=True)


def agent(data: Path, workloads: Path, reports: Recorder) -> Agent:
    walls = Walls(data, ())
    assert walls.hierarchy is not None, walls.off
    walls.namespace = False
    made = Agent(
        "n",
        data,
        reports=reports,
        heartbeat_interval=0.0,
        poll_interval=0.05,
        workloads_dir=workloads,
        walls=walls,
    )
    made.start_thread()
    return made


def left_behind(agent: Agent, name: str) -> int:
    log = agent.log_path(name, 0)
    text = wait_until(lambda: log.exists() and "left" in (t := log.read_text()) and t, 20, name)
    return int(text.split()[1])


def test_what_a_task_left_is_killed_before_its_end_is_reported(
    folders: tuple[Path, Path],
) -> None:
    witness = Witness()
    worker = agent(*folders, witness)
    try:
        worker.start([launch("leaver", ["sh", "-c", LEAVE.replace("exec sleep 300", "exit 3")])])
        escaped = left_behind(worker, "leaver")
        witness.watched.append(escaped)
        wait_until(lambda: "leaver" in witness.ended, 20, "the end")
        assert witness.ended["leaver"] == (3, "exited with code 3")
        assert witness.alive_at[("end", "leaver")] == []
        assert worker.walls.hierarchy is not None and worker.walls.hierarchy.tasks() == []
    finally:
        worker.close()


def test_what_an_exec_left_in_a_task_without_a_namespace_dies_before_its_end_is_reported(
    folders: tuple[Path, Path],
) -> None:
    """Without a process namespace an exec session still enters its task's cgroup: a
    `setsid` child it starts is killed with the task, before the task's end is reported
    (before, it was the agent's, and lived on)."""
    witness = Witness()
    worker = agent(*folders, witness)
    session = None
    try:
        worker.start([launch("host", ["sleep", "300"])])
        wait_until(lambda: "host" in witness.started, 20, "the start")
        leave = "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo left $!"
        session = worker.open_session("host", 0, ["sh", "-c", leave], False)
        output = wait_until(lambda: read_some(session.output), 20, "the exec's output")
        escaped = int(output.split()[1])
        assert running(escaped)
        witness.watched.append(escaped)
        worker.stop([TaskStop("host", "n", (0,), "cancelled", 0.5)])
        wait_until(lambda: "host" in witness.ended, 20, "the end")
        assert witness.alive_at[("end", "host")] == []
    finally:
        if session is not None:
            session.release()
        worker.close()


def read_some(fd: int) -> bytes:
    """What a non-blocking fd holds now."""
    with contextlib.suppress(BlockingIOError):
        return os.read(fd, 4096)
    return b""


def test_an_agent_started_again_kills_what_a_dead_launcher_left(
    folders: tuple[Path, Path],
) -> None:
    recorder = Recorder()
    first = agent(*folders, recorder)
    first.start([launch("orphan", ["sh", "-c", LEAVE])])
    escaped = left_behind(first, "orphan")
    launcher = wait_until(lambda: recorder.started.get("orphan"), 20, "the start")
    first.close()
    # The launcher dies alone (its group lives on): nobody will record or stop the task.
    os.kill(launcher, signal.SIGKILL)
    wait_until(lambda: not running(launcher), 10, "the launcher to die")
    assert running(escaped)
    second = agent(*folders, Recorder())
    try:
        wait_until(lambda: not running(escaped), 10, "what it left to be killed")
        hierarchy = second.walls.hierarchy
        assert hierarchy is not None
        wait_until(lambda: not hierarchy.tasks(), 10, "its cgroup to go")
    finally:
        second.close()


def test_a_stray_started_again_waits_until_what_it_left_is_gone(
    folders: tuple[Path, Path],
) -> None:
    first = agent(*folders, Recorder())
    first.start([launch("stray", ["sh", "-c", LEAVE])])
    escaped = left_behind(first, "stray")
    first.close()
    witness = Witness()
    second = agent(*folders, witness)
    try:
        assert second.strays() == {("stray", 0)}
        witness.watched.append(escaped)
        # Started again under another launch: the stray is stopped (its group gets
        # SIGTERM, its cgroup SIGKILL once its launcher has ended), then the task starts.
        second.start([launch("stray", ["sh", "-c", "echo again"], launch=2)])
        wait_until(lambda: "stray" in witness.started, 20, "the new start")
        assert witness.alive_at[("start", "stray")] == []
    finally:
        second.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(escaped, signal.SIGKILL)
        time.sleep(0.1)


def test_without_root_limits_are_off_and_say_so(folders: tuple[Path, Path]) -> None:
    """An agent that is not root (a laptop) runs tasks as before, their log capped, their
    ports open, and says why they have no limits."""
    data, _ = folders
    os.seteuid(65534)  # nobody, for as long as the agent looks at what it may do
    try:
        walls = Walls(data, ())
    finally:
        os.seteuid(0)
    assert walls.hierarchy is None and not walls.namespace
    [line] = walls.describe()
    assert line.startswith("limits are off: corral does not run as root; tasks have no "), line
    assert "each task sees every process of the machine; the ports a task is given answer " in line
    assert "every process (corral does not run as root); task logs keep their last 1GiB" in line
    assert walls.ports is None
    assert walls.launcher_options(None) == ("--log-cap", str(1 << 30))
    off = Walls(data, (), WallOptions(limits=False))
    assert off.describe()[0].startswith("limits are off: turned off (--no-task-limits);")
