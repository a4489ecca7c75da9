"""kill -9 `corral up` while tasks run, start it again on the same data directory and port:
the tasks that survived are adopted (not started twice) and finish normally; a task that
vanished while the server was down counts as failed, and its retry policy decides."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from livecorral import PYTHON, Servers, running, task_commands, wait_until

from corral.agent.process import alive, process_start

# Prints a line at start and at the end; waits argv[1] on the first attempt and argv[2]
# on later ones: a number of seconds, or a file to appear.
JOB = """
import os, sys, time
print("start pid", os.getpid(), flush=True)
wait = sys.argv[1] if os.environ["CORRAL_ATTEMPT"] == "1" else sys.argv[2]
if os.path.isabs(wait):
    deadline = time.time() + 300
    while not os.path.exists(wait) and time.time() < deadline:
        time.sleep(0.1)
else:
    time.sleep(float(wait))
print("end", flush=True)
"""


def test_tasks_survive_a_kill_9_of_the_server_and_are_adopted(corral_up: Servers) -> None:
    up = corral_up(6, {"team": 6})
    # They run until the server is back, however long that takes on a loaded machine: a
    # task that ended before would be reported, not adopted.
    gate = str(up.data_dir / "server-is-back")
    up.submit("keep", "team", [PYTHON, "-c", JOB, gate, "1"], gpu=1)
    up.submit("keep-gang", "team", [PYTHON, "-c", JOB, gate, "1"], gpu=1, replicas=2)
    up.submit("vanish-retry", "team", [PYTHON, "-c", JOB, "60", "1"], gpu=1, backoff_limit=1)
    up.submit("vanish-fail", "team", [PYTHON, "-c", JOB, "60", "1"], gpu=1)
    tasks = [("keep", 0), ("keep-gang", 0), ("keep-gang", 1), ("vanish-retry", 0)]
    tasks.append(("vanish-fail", 0))
    for name, task in tasks:
        up.wait_log(name, "start pid", task)
    launchers: dict[tuple[str, int], tuple[int, int]] = {}
    for name in ("keep", "keep-gang", "vanish-retry", "vanish-fail"):
        for task, pid in up.started_pids(name):
            started = process_start(pid)
            assert started is not None and alive(pid, started)
            launchers[(name, task)] = (pid, started)
    assert sorted(launchers) == sorted(tasks)
    commands = task_commands(up.workloads_dir)
    for key, (pid, _) in launchers.items():
        # The command runs in the group of the launcher whose pid the server recorded.
        assert {os.getpgid(command) for command, _ in commands[key]} == {pid}

    up.kill9()
    for pid, started in launchers.values():
        assert alive(pid, started), "a task died with the server"
    # While the server is down, two tasks vanish.
    vanished = [launchers[(name, 0)][0] for name in ("vanish-retry", "vanish-fail")]
    for pid in vanished:
        os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not any(running(pid) for pid in vanished), 10, "the two to die")
    up.start()

    # The survivors are adopted: the very same processes, still running after the restart.
    for name, task in tasks[:3]:
        pid, started = launchers[(name, task)]
        assert alive(pid, started)
    Path(gate).touch()
    for name in ("keep", "keep-gang"):
        done = up.wait_status(name, timeout=40)
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 1
        assert len(up.events(name, "bound")) == 1
    for name, task in tasks[:3]:
        log = up.log_text(name, task)
        pid, _ = launchers[(name, task)]
        assert len(re.findall("^start pid", log, re.M)) == 1, log
        assert log.endswith("end\n"), log
        assert [p for t, p in up.started_pids(name) if t == task] == [pid]

    # The vanished tasks were noticed (killed by SIGKILL, no exit code recorded) and their
    # workloads follow their retry policy.
    failed = up.wait_status("vanish-fail", timeout=30)
    assert failed["status"] == "failed", failed
    assert "SIGKILL" in failed["reason"], failed
    assert len(up.events("vanish-fail", "task-started")) == 1
    assert "end" not in up.log_text("vanish-fail")

    retried = up.wait_status("vanish-retry", timeout=30)
    assert retried["status"] == "succeeded", retried
    [retrying] = up.events("vanish-retry", "retrying")
    assert "SIGKILL" in retrying["reason"], retrying
    assert retried["attempts"] == 2
    runs = up.started_pids("vanish-retry")
    assert len(runs) == 2 and runs[0][1] == launchers[("vanish-retry", 0)][0]
    assert runs[1][1] != runs[0][1]
    log = up.log_text("vanish-retry")
    assert len(re.findall("^start pid", log, re.M)) == 2 and log.count("end\n") == 1


def test_max_runtime_counts_from_the_task_start_across_a_restart(corral_up: Servers) -> None:
    """A task adopted after a restart keeps the deadline it had: max_runtime counts from
    when it started, not from when the new server found it again."""
    up = corral_up(1, {"team": 1})
    up.submit("overdue", "team", ["sh", "-c", "echo start; exec sleep 60"], gpu=1, max_runtime=4)
    up.wait_log("overdue", "start")
    [started] = up.events("overdue", "task-started")
    up.kill9()
    # The server stays down past the task's deadline; nobody can stop it meanwhile.
    wait_until(lambda: time.time() > started["time"] + 4.5, 10, "the deadline to pass", 0.1)
    up.start()
    back = time.time()
    done = up.wait_status("overdue", timeout=20)
    assert done["status"] == "failed" and "maximum runtime" in done["reason"], done
    [failed] = up.events("overdue", "failed")
    # Overdue when found again, so stopped at once (a 2 s allowance for a busy machine);
    # a deadline restarted at adoption would let it run 4 s more.
    late = failed["time"] - max(started["time"] + 4, back)
    assert late < 2, f"stopped {late:.1f} s after its deadline or the restart"
