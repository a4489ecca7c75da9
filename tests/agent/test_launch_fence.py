"""The launcher under Ray: detached from its parent's process tree, and fenced by a lease
that the agent renews (corral.cluster.ray_agent)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from livecorral import running, wait_until

from corral.agent.process import TaskProcess

SLEEPER = "import os, time; print('child', os.getpid(), flush=True); time.sleep(60)"


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def test_a_detached_launcher_runs_while_its_lease_is_renewed_and_fences_itself(
    tmp_path: Path,
) -> None:
    lease = tmp_path / "lease"
    lease.touch()
    log, exit_file = tmp_path / "task.log", tmp_path / "task.exit"
    options = ("--lease", str(lease), "--fence", "1.5")
    task = TaskProcess.spawn_detached(
        [sys.executable, "-c", SLEEPER], dict(os.environ), None, log, exit_file, options
    )
    try:
        assert task.popen is None
        assert parent_of(task.pid) != os.getpid(), "the launcher is still our child"
        assert os.getpgid(task.pid) == task.pid, "the launcher leads its own group"
        text = wait_until(lambda: "child" in (t := log.read_text()) and t, 10, "the start")
        child = int(text.split()[1])
        # Renewed: it runs on past the fence timeout.
        for _ in range(6):
            lease.touch()
            time.sleep(0.5)
        assert running(task.pid) and running(child)
        assert task.ended() is None
        # Not renewed: the whole group is gone soon after the fence timeout.
        stopped = time.monotonic()
        wait_until(lambda: not running(child) and not running(task.pid), 10, "the fence")
        assert time.monotonic() - stopped < 1.5 + 2.0
        code, reason = task.ended() or (None, None)
        assert code == 137
        assert reason is not None and reason.startswith("fenced")
    finally:
        task.signal(9)
