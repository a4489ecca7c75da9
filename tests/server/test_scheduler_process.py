"""`corral server` runs its scheduler loop in a child process: it schedules, answers for
the last cycle (queue listings), is started again when it dies, and does not outlive
the server however the server ends."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from server_support import Api, wait_for

CHILD = "corral.control.scheduler_process"


def children(pid: int) -> list[int]:
    """The scheduler processes of the server `pid`."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in found.split() if CHILD in command_line(int(child))]


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def the_child(server: Any) -> int:
    found: list[int] = wait_for(lambda: children(server.process.pid), "the scheduler process")
    assert len(found) == 1, found
    return found[0]


def bound(api: Api) -> str:
    """A workload submitted and bound; returns its project."""
    queue = api.queue("sp")
    pool = queue["name"]
    api.node(pool, gpus=2)
    name = api.submit(queue["name"], pool)["name"]
    api.wait_status(name, "running")
    return str(queue["name"])


def test_the_scheduler_runs_in_a_process_of_its_own(live_server: Any) -> None:
    api = Api(live_server)
    child = the_child(live_server)
    # The database URL (and any password in it) reaches the child by its socket, not
    # on its command line, which every local user may read.
    assert live_server.db is None or live_server.db not in command_line(child)
    project = bound(api)
    # The server answers for the child's last cycle: the project's share and allocation.
    queue = wait_for(
        lambda: (
            (q := api.admin.get(f"/queues/{project}").json())["allocated"]
            and q["allocated"]["gpu"] == 1.0
            and q
        ),
        "the cycle's allocation in the queue listing",
    )
    assert queue["fair_share"]["gpu"] >= 1.0
    assert api.admin.get("/cluster").json()["last_cycle_seconds"] > 0
    api.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_scheduler_process_that_dies_is_started_again(live_server: Any) -> None:
    api = Api(live_server)
    first = the_child(live_server)
    os.kill(first, signal.SIGKILL)
    second = wait_for(
        lambda: [pid for pid in children(live_server.process.pid) if pid != first],
        "another scheduler process",
    )[0]
    assert not alive(first)
    bound(api)
    assert children(live_server.process.pid) == [second]
    api.close()
    assert "the scheduler process ended" in live_server.log.read_text()


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_scheduler_process_ends_with_the_server(live_server: Any, how: int) -> None:
    child = the_child(live_server)
    live_server.process.send_signal(how)
    live_server.process.wait(30)
    wait_for(lambda: not alive(child), "the scheduler process to end", timeout=30)
