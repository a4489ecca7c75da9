"""Helpers of the Ray tests: a real local Ray cluster (`ray.cluster_utils.Cluster`, a
head and worker nodes on 127.0.0.x with virtual GPUs and labels) and real `corral server
--ray` processes. Everything runs on loopback. Teardown stops exactly what was started
here: the servers by their process groups, corral's agent actors by name, the task
processes by their data directory, the Ray nodes through the Cluster object. Never
`ray stop`, which would also stop other people's Ray.

Without Ray installed these tests skip, except under CI=true, where they must run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "agent"))

from livecorral import CORRAL, CorralUp, remove_walls, running
from livecorral import free_port as free_port  # for the fixtures
from livecorral import kill_everything_of as kill_everything_of

IN_CI = os.environ.get("CI", "").lower() == "true"


def without_containers(labels: dict[str, str]) -> dict[str, str]:
    """A node's labels but the one its agent gives it when it runs tasks in images
    (corral.agent.containers), which depends on the machine."""
    from corral.model.spec import CONTAINERS_LABEL

    return {key: value for key, value in labels.items() if key != CONTAINERS_LABEL}


def require_ray() -> None:
    """Skip the calling test module when Ray is not installed, except under CI=true."""
    if importlib.util.find_spec("ray") is None:
        if IN_CI:
            raise ImportError("ray is not installed; CI must run the Ray tests")
        pytest.skip("ray is not installed", allow_module_level=True)


# Seconds, as the servers of these tests run: a node is lost after LOSS, its tasks fenced
# after FENCE. Longer than the defaults (10 and 4): a restart of the server must take
# less than FENCE, and a 2-core machine shared with other work can be slow (`make unit`
# runs these tests beside the others; a restart there took more than 12 s).
LOSS = 40.0
FENCE = 25.0
GPUS = 2


@dataclass
class RayNodes:
    """A local Ray cluster: the head (no GPUs) and worker nodes named a, b, c... each with
    GPUS virtual GPUs and a `corral.io/rack` label."""

    cluster: Any
    workers: dict[str, Any] = field(default_factory=dict)
    next_ip: int = 2

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add(self, name: str, rack: str, gpus: int = GPUS) -> Any:
        for attempt in (1, 2):
            address = f"127.0.0.{self.next_ip}"
            self.next_ip += 1
            try:
                node = self.cluster.add_node(
                    num_cpus=1,
                    node_ip_address=address,
                    resources={"corral_virtual_gpus": gpus},
                    labels={"corral.io/name": name, "corral.io/rack": rack},
                )
            except Exception as error:
                # Ray gives a raylet 30 s to register, which a loaded 2-core machine may
                # not grant: that one is killed (it must not join later under the same
                # name) and another node started, at the next address.
                if attempt == 2 or "timed out during startup" not in str(error):
                    raise
                kill_node_processes(address)
                continue
            self.workers[name] = node
            return node
        raise AssertionError("unreachable")

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.workers.pop(name), allow_graceful=False)

    def kill_agents(self, namespace: str) -> None:
        """Kill corral's agent actors of one namespace (and nothing else)."""
        import ray

        for actor in ray.util.list_named_actors(all_namespaces=True):
            if actor["namespace"] == namespace:
                with contextlib.suppress(Exception):
                    ray.kill(ray.get_actor(actor["name"], namespace=namespace))


def kill_node_processes(address: str) -> None:
    """SIGKILL the processes of the Ray node started at `address` (each node of the tests
    has an address of its own)."""
    marks = (f"--node_ip_address={address}".encode(), f"--node-ip-address={address}".encode())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            if any(mark in command for mark in marks):
                os.kill(int(entry.name), signal.SIGKILL)


@dataclass
class RayServer(CorralUp):
    """`corral server --ray ADDRESS` with its own data directory, agent directory and
    agent namespace."""

    address: str = ""
    namespace: str = ""
    command: str = "server"
    loss: float = LOSS
    fence: float = FENCE
    # More options of the command (`--checkpoint-root PATH`...).
    options: tuple[str, ...] = ()
    # The Ray agents keep their workloads' directories under the agent directory: not in
    # a directory of the temporary folder made for `corral up` (as the base class does),
    # which nothing here would use or remove.
    workloads_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.workloads_dir = self.agent_dir

    @property
    def agent_dir(self) -> Path:
        return self.data_dir / "agents"

    def start(self) -> RayServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            CORRAL,
            self.command,
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--ray",
            self.address,
            "--agent-dir",
            str(self.agent_dir),
            "--loss-timeout",
            f"{self.loss:g}",
            "--fence-timeout",
            f"{self.fence:g}",
            *self.options,
        ]
        if self.admin_unix_user is not None:
            args += ["--admin-unix-user", self.admin_unix_user]
        env = dict(os.environ, CORRAL_RAY_NAMESPACE=self.namespace)
        with open(self.log, "ab") as handle:
            self.process = subprocess.Popen(
                args, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        self.starts += 1
        self._wait_healthy()
        self.token = (self.data_dir / "admin-token").read_text().strip()
        # Its output is a file, not a terminal: the admin token is only in its 0600 file.
        assert self.token not in self.log.read_text(), f"the admin token is in {self.log}"
        return self

    def _wait_healthy(self) -> None:
        import httpx

        process = self.process
        assert process is not None
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"corral server exited: {self.log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"corral server did not start: {self.log.read_text()}")
            time.sleep(0.1)

    def nodes(self) -> dict[str, Any]:
        return {node["name"]: node for node in self.get("/nodes")}


def live_tasks(name: str) -> list[tuple[str, int]]:
    """(RANK, pid) of the live task processes of a workload (launchers not counted)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if b"corral.agent.launch" in cmdline or not running(int(entry)):
            continue
        env = dict(
            item.split("=", 1)
            for item in environ.decode(errors="replace").split("\0")
            if "=" in item
        )
        if env.get("CORRAL_WORKLOAD") == name:
            found.append((env["RANK"], int(entry)))
    return found


@contextlib.contextmanager
def watched(name: str) -> Iterator[list[list[tuple[str, int]]]]:
    """Every moment, while in the block, at which a rank of the workload had two live
    processes (one that should have stopped, and its replacement)."""
    twice: list[list[tuple[str, int]]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            tasks = live_tasks(name)
            if len({rank for rank, _ in tasks}) < len(tasks):
                twice.append(tasks)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield twice
    finally:
        stop.set()
        watcher.join()


def stop_server(server: RayServer, nodes: RayNodes, root: Path) -> None:
    """Kill a server of the tests, its agents (by its namespace) and every process left
    under `root`."""
    if server.process is not None and server.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=30)
    nodes.kill_agents(server.namespace)
    kill_everything_of(root)
    # Each node's agent keeps its walls under its own folder's name.
    for folder in server.agent_dir.glob("*") if server.agent_dir.is_dir() else ():
        remove_walls(folder)
