"""Task processes running from before an agent started, that the store does not adopt:
a victim whose preemption was committed just before a crash (it never got its SIGTERM),
a task whose start never reached the store. The agent finds their launchers in /proc by
their exit file in its data directory; they are stopped unless the store adopts them,
and a task started again waits for its old process to go. Real launchers, real signals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from livecorral import PYTHON, Servers, running, wait_until

from corral.agent import Agent
from corral.agent.process import TaskProcess, alive
from corral.agent.strays import find_strays
from corral.messages import TaskLaunch, TaskStop
from corral.server.main import database_url
from corral.store import Store

# Says that it started and when it was asked to stop, then leaves within a second.
POLITE = """
import signal, sys, time
def leave(*_):
    print("asked to stop", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
print("started", flush=True)
while True:
    time.sleep(0.1)
"""
# Ignores SIGTERM: only SIGKILL stops it.
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('started', flush=True); time.sleep(120)"
)


def plant(data_dir: Path, workload: str, task: int, code: str, devices: str = "0") -> TaskProcess:
    """A task's launcher as an agent before a crash started it, and left it running; once
    its command has set its SIGTERM handler."""
    process = TaskProcess.spawn(
        [sys.executable, "-c", code],
        {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": devices},
        None,
        data_dir / "logs" / workload / f"task-{task}.log",
        data_dir / "run" / workload / f"task-{task}.exit",
    )
    wait_until(lambda: "started" in _log(data_dir, workload, task), 20, "the planted task")
    return process


def launch(workload: str, task: int = 0, **more: object) -> TaskLaunch:
    fields: dict[str, object] = {
        "workload": workload,
        "project": "team",
        "task": task,
        "attempt": 1,
        "node": "n1",
        "command": (sys.executable, "-c", "import time; time.sleep(60)"),
        "devices": (0,),
        "gpu": 1.0,
        "grace": 2.0,
    }
    fields.update(more)
    return TaskLaunch(**fields)  # type: ignore[arg-type]


@pytest.fixture
def data_dir(tmp_path: Path):  # type: ignore[no-untyped-def]
    folder = tmp_path / "data"
    folder.mkdir()
    planted: list[TaskProcess] = []
    yield folder, planted
    for process in planted:
        process.signal(9)
        if process.popen is not None:
            process.popen.wait()


def make_agent(folder: Path) -> Agent:
    return Agent(
        "n1", folder, poll_interval=0.05, workloads_dir=folder / "w", run_as_submitter=False
    )


def gone(process: TaskProcess) -> bool:
    assert process.popen is not None
    return process.popen.poll() is not None


def test_an_unbound_stray_is_found_and_stopped_politely(data_dir) -> None:  # type: ignore[no-untyped-def]
    folder, planted = data_dir
    victim = plant(folder, "victim", 1, POLITE)
    planted.append(victim)
    agent = make_agent(folder)
    try:
        # Not one of the agent's tasks, but known to the reconciler.
        assert agent.running() == set()
        assert agent.strays() == {("victim", 1)}
        agent.stop([TaskStop("victim", "n1", (1,), "no longer bound here", 5.0)])
        wait_until(lambda: gone(victim), 10, "the stray to stop")
        assert "asked to stop" in _log(folder, "victim", 1)
        wait_until(lambda: (agent.tick(), agent.strays())[1] == set(), 5, "the stray forgotten")
    finally:
        agent.close()


def test_a_stray_that_ignores_sigterm_is_killed_after_its_grace(data_dir) -> None:  # type: ignore[no-untyped-def]
    folder, planted = data_dir
    victim = plant(folder, "stubborn", 0, STUBBORN)
    planted.append(victim)
    agent = make_agent(folder)
    try:
        agent.stop([TaskStop("stubborn", "n1", (0,), "no longer bound here", 3.0)])
        time.sleep(0.5)
        agent.tick()
        assert not gone(victim), "killed before its grace period"
        wait_until(lambda: (agent.tick(), gone(victim))[1], 10, "SIGKILL after the grace")
    finally:
        agent.close()


def test_a_stray_the_store_binds_is_adopted_not_stopped(data_dir) -> None:  # type: ignore[no-untyped-def]
    folder, planted = data_dir
    kept = plant(folder, "kept", 0, POLITE)
    planted.append(kept)
    agent = make_agent(folder)
    try:
        assert agent.strays() == {("kept", 0)}
        agent.start([launch("kept", pid=kept.pid, proc_start=kept.proc_start)])
        assert agent.strays() == set()
        assert agent.running() == {("kept", 0)}
        for _ in range(5):
            agent.tick()
            time.sleep(0.05)
        assert alive(kept.pid, kept.proc_start)
        assert "asked to stop" not in _log(folder, "kept", 0)
    finally:
        agent.close()


def test_a_task_started_again_waits_for_its_old_process(data_dir) -> None:  # type: ignore[no-untyped-def]
    """The start of the old process never reached the store (or it is of an older launch):
    it is stopped, and the new one starts only once it has gone, never beside it."""
    folder, planted = data_dir
    old = plant(folder, "again", 0, STUBBORN)
    planted.append(old)
    agent = make_agent(folder)
    try:
        agent.start([launch("again", grace=1.5)])
        assert agent.running() == {("again", 0)}
        started = agent._tasks[("again", 0)]
        assert started.process is None, "started beside its old process"
        wait_until(lambda: (agent.tick(), gone(old))[1], 10, "the old process to be killed")
        wait_until(lambda: (agent.tick(), started.process)[1] is not None, 10, "the new start")
        assert started.process is not None and started.process.pid != old.pid
    finally:
        for task in agent._tasks.values():
            if task.process is not None:
                planted.append(task.process)
        agent.close()


def test_a_strays_devices_are_held_until_it_has_gone(data_dir) -> None:  # type: ignore[no-untyped-def]
    folder, planted = data_dir
    old = plant(folder, "holder", 0, STUBBORN, devices="1")
    planted.append(old)
    agent = make_agent(folder)
    try:
        agent.stop([TaskStop("holder", "n1", (0,), "no longer bound here", 1.5)])
        agent.start([launch("on-1", devices=(1,)), launch("on-0", devices=(0,))])
        on_1, on_0 = agent._tasks[("on-1", 0)], agent._tasks[("on-0", 0)]
        agent.tick()
        assert on_0.process is not None, "a free device waited for a stray on another"
        assert on_1.process is None, "started on a device a stray still holds"
        wait_until(lambda: (agent.tick(), on_1.process)[1] is not None, 10, "device 1 freed")
        assert gone(old)
    finally:
        for task in agent._tasks.values():
            if task.process is not None:
                planted.append(task.process)
        agent.close()


def by_hand(arguments: list[str]) -> subprocess.Popen[bytes]:
    """A launcher started as the agent starts one: its own group, its environment given."""
    process = subprocess.Popen(arguments, start_new_session=True, stdin=subprocess.PIPE)
    assert process.stdin is not None
    with process.stdin:
        process.stdin.write(json.dumps({"PATH": os.environ["PATH"]}).encode())
    return process


def test_a_process_that_only_names_a_launcher_is_not_taken_for_one(tmp_path: Path) -> None:
    """A task cannot make an agent stop another's work, or hold its devices, by putting a
    launcher's arguments on its own command line: it leads no process group of its own,
    or, as a member's task that leads one, it does not run as the agent's account."""
    run = tmp_path / "run"
    fake = ["-m", "corral.agent.launch", "--exit-file", str(run / "someone.7" / "task-0.exit")]
    sleeper = ["/bin/sh", "-c", "sleep 30", *fake, "--", "x"]
    processes = [subprocess.Popen(sleeper)]
    if os.geteuid() == 0:
        processes.append(subprocess.Popen(sleeper, start_new_session=True, user="nobody"))
    # A real launcher, of another data directory.
    other = str(tmp_path / "other" / "task-0.exit")
    processes.append(
        by_hand(
            [PYTHON, "-I", "-m", "corral.agent.launch", "--exit-file", other, "--", "sleep", "30"]
        )
    )
    try:
        wait_until(lambda: all(running(p.pid) for p in processes), 5, "all of them to run")
        assert find_strays(run) == {}
        # The same launcher, of this data directory, is one.
        processes.append(by_hand([PYTHON, "-I", *fake, "--", "sleep", "30"]))
        found = wait_until(lambda: find_strays(run), 5, "the real launcher")
        assert [(s.key, s.directory, s.pid) for s in found.values()] == [
            (("someone", 0), "someone.7", processes[-1].pid)
        ]
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_a_victim_left_running_by_a_crash_is_stopped_after_the_restart(
    corral_up: Servers,
) -> None:
    """The window the chaos suite met: the store took a task off its node (here a
    suspension; a preemption commits the same way) and the server died before the task's
    SIGTERM. The restarted server's agent finds the process and the reconciler stops it."""
    up = corral_up(2, {"team": 2})
    up.submit("victim", "team", [PYTHON, "-c", POLITE], gpu=1)
    up.wait_log("victim", "started")
    ((_, pid),) = up.started_pids("victim")
    up.kill9()
    store = Store(database_url(up.data_dir, None))
    try:
        store.suspend("team/victim", "suspended while the server was down")
    finally:
        store.close()
    assert running(pid), "the task died with the server"
    up.start()
    wait_until(lambda: not running(pid), 30, "the unbound task to be stopped")
    assert "asked to stop" in up.log_text("victim")
    # Resumed, it runs again: a new process, and only one.
    with up.client() as client:
        assert client.post("/workloads/victim/resume").status_code == 200
    up.wait_status("victim", "running")
    wait_until(lambda: len(up.started_pids("victim")) == 2, 30, "the second start")
    again = up.started_pids("victim")[1][1]
    assert again != pid and running(again) and not running(pid)
    with up.client() as client:
        assert client.delete("/workloads/victim").status_code in (200, 204)
    wait_until(lambda: not running(again), 30, "the deleted workload's task to stop")


def _log(folder: Path, workload: str, task: int) -> str:
    path = folder / "logs" / workload / f"task-{task}.log"
    return path.read_text() if path.exists() else ""
