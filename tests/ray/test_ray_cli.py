"""End to end: the real `ray start` CLI and `corral up --ray`, as a user runs them, on
this machine's loopback only (as docs/multi-node.md tells).

Every Ray node is started with its own --temp-dir and ports; teardown kills exactly the
processes whose command line names that directory, and their children (a raylet's agents
and workers rename themselves), never with `ray stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import (
    PYTHON,
    free_port,
    kill_everything_of,
    processes_of,
    remove_walls,
    running,
    wait_until,
)
from raycorral import RayServer, require_ray, without_containers

require_ray()

RAY = str(Path(PYTHON).with_name("ray"))
# With this at 0, a head at 127.0.0.1 stays there (and listens there only); without it,
# Ray announces it at the machine's outward address.
LOOPBACK_HEAD = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# The head's GCS listens on 127.0.0.1 only, and `ray start --address` rewrites that very
# spelling (and `localhost`) into the machine's outward address, where nothing answers.
# The same address written as IPv4-mapped IPv6 is not rewritten.
HEAD_FROM_A_NODE = "[::ffff:127.0.0.1]"


def ray_start(temp: Path, env: dict[str, str], *args: str) -> None:
    """`ray start ARGS` for one node with 1 CPU, 2 virtual GPUs, Ray's session files in
    `temp` and free ports of its own."""
    command = [RAY, "start", *args, "--num-cpus", "1", "--temp-dir", str(temp)]
    command += ["--disable-usage-stats", "--resources", json.dumps({"corral_virtual_gpus": 2})]
    for option in (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    ):
        command += [option, str(free_port())]
    started = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert started.returncode == 0, started.stdout + started.stderr


def _children(parents: set[int]) -> set[int]:
    """The live processes whose parent is one of `parents`."""
    found = set()
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) in parents and running(pid):
                found.add(pid)
    return found


def kill_ray_session(temp: Path) -> None:
    """SIGKILL the processes of the Ray node whose --temp-dir is `temp`: those naming it
    and their descendants, found while stopped so that none forks away in between."""
    stopped: set[int] = set()
    while new := (set(processes_of(temp)) | _children(stopped)) - stopped:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(map(running, stopped)), 30, "the Ray processes to end")
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def ray_head() -> Iterator[str]:
    """`ray start --head` on 127.0.0.1 with 2 virtual GPUs; its address."""
    temp = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))  # Ray's socket paths are short
    port = free_port()
    try:
        ray_start(
            temp,
            dict(os.environ, **{LOOPBACK_HEAD: "0"}),
            *("--head", "--node-ip-address", "127.0.0.1", "--port", str(port)),
            *("--include-dashboard", "false", "--labels", "corral.io/name=head,corral.io/rack=r1"),
        )
        yield f"127.0.0.1:{port}"
    finally:
        kill_ray_session(temp)


@pytest.fixture
def ray_second_node(ray_head: str) -> Iterator[str]:
    """A second node, `ray start --address`, on 127.0.0.2 with 2 virtual GPUs; the head's
    address."""
    # A temp dir of its own: without one, Ray gives a node the head's, and its processes
    # would name the head's.
    temp = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))
    port = ray_head.rpartition(":")[2]
    # `ray start --address` refuses to start with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0.
    env = {key: value for key, value in os.environ.items() if key != LOOPBACK_HEAD}
    try:
        ray_start(
            temp,
            env,
            *("--address", f"{HEAD_FROM_A_NODE}:{port}", "--node-ip-address", "127.0.0.2"),
            *("--labels", "corral.io/name=second,corral.io/rack=r2"),
        )
        yield ray_head
    finally:
        kill_ray_session(temp)


@contextlib.contextmanager
def corral_up(address: str, root: Path, *options: str) -> Iterator[RayServer]:
    """`corral up --ray ADDRESS OPTIONS`, killed with its tasks at the end."""
    up = RayServer(root, 0, address=address, namespace="corral-e2e", command="up", options=options)
    try:
        yield up.start()
    finally:
        if up.process is not None and up.process.poll() is None:
            os.killpg(up.process.pid, signal.SIGKILL)
            up.process.wait(timeout=30)
        kill_everything_of(root)
        for folder in up.agent_dir.glob("*") if up.agent_dir.is_dir() else ():
            remove_walls(folder)


def test_corral_up_on_a_ray_started_by_the_cli(ray_head: str, tmp_path: Path) -> None:
    with corral_up(ray_head, tmp_path) as up:
        nodes = wait_until(lambda: up.get("/nodes"), 30, "the head node to join")
        labels = [without_containers(n["labels"]) for n in nodes]
        assert [(n["name"], n["gpus"]) for n in nodes] == [("head", 2)]
        assert labels == [{"rack": "r1"}]
        up.queue("team", 2)
        up.submit("hello", "team", [PYTHON, "-c", "print('hello from ray')"], gpu=1)
        done = up.wait_status("hello", timeout=60)
        assert done["status"] == "succeeded", done
        wait_until(lambda: "hello from ray" in up.log_text("hello"), 30, "the log")


def test_a_gang_spans_two_nodes_started_by_the_cli(ray_second_node: str, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    with corral_up(ray_second_node, tmp_path, "--checkpoint-root", str(shared)) as up:
        nodes = wait_until(
            lambda: n if len(n := up.get("/nodes")) == 2 else None, 60, "both Ray nodes to join"
        )
        assert [
            (n["name"], n["address"], n["gpus"], without_containers(n["labels"])) for n in nodes
        ] == [
            ("head", "127.0.0.1", 2, {"rack": "r1"}),
            ("second", "127.0.0.2", 2, {"rack": "r2"}),
        ]
        up.queue("team", 4)
        say = "import os; print('task', os.environ['CORRAL_TASK_INDEX'], 'checkpoints in', "
        say += "os.environ['CORRAL_CHECKPOINT_DIR'])"
        up.submit("spread", "team", [PYTHON, "-c", say], gpu=2, replicas=2)
        done = up.wait_status("spread", timeout=90)
        assert done["status"] == "succeeded", done
        started = {e["node"]: e["reason"] for e in up.events("spread", "task-started")}
        assert sorted(started) == ["head", "second"], started
        # The log of each task, one on each node, reached the server; both tasks had the
        # same checkpoint directory, CHECKPOINT_ROOT/<project>_<workload>.<id>/checkpoints.
        own = f"{shared}/{up.workload('spread')['directory']}"
        for task in (0, 1):
            up.wait_log("spread", f"task {task} checkpoints in {own}/checkpoints", task)
