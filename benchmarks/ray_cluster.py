"""corral on a local Ray cluster: joining, losing a node, and task throughput.

    python benchmarks/ray_cluster.py [--json] [--tasks N]

Starts a Ray cluster on loopback (`ray.cluster_utils.Cluster`: a head and 3 worker nodes
on 127.0.0.2-4 with 2 virtual GPUs each) and `corral server --ray` on it (loss timeout
10 s, fence timeout 4 s: the defaults), then measures:

- `join_to_first_task_s`: a workload waits for a node labelled rack=new; from the call
  that adds such a Ray node until its task runs (the Ray node's own start included;
  `join_to_registered_s` is the part until it is listed by corral).
- `loss_to_requeued_s` and `loss_to_running_s`: a 2-node gang runs; from removing one
  of its nodes until the gang is requeued, and until both of its tasks run again.
- `tasks_per_s_ray` and `tasks_per_s_local`: N one-line tasks of a quarter GPU each, from
  submitting the first until all succeeded, on the Ray cluster and on `corral up
  --virtual-gpus 6` (the in-process transport).

Everything it started is stopped by handle or process group (never `ray stop`). With
--json the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

CORRAL = str(Path(sys.executable).with_name("corral"))
PYTHON = sys.executable
GPUS = 2
SLEEP = (
    "import os, sys, time; "
    "time.sleep(float(sys.argv[1]) if os.environ['CORRAL_ATTEMPT'] == '1' else 60)"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Corral:
    """A `corral` server process and its API."""

    def __init__(self, args: list[str], data_dir: Path) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        if os.geteuid() == 0:
            # Agents that run as root run each task as its submitter's account: the
            # benchmark submits as the admin, whose tasks then run as root.
            args = [*args, "--admin-unix-user", "root"]
        log = open(data_dir / "server.log", "ab")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            [CORRAL, *args, "--data-dir", str(data_dir), "--port", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{self.port}"

        def healthy() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError((data_dir / "server.log").read_text())
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            return False

        wait(healthy, 60, "the server")
        token = (data_dir / "admin-token").read_text().strip()
        self.client = httpx.Client(
            base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.client.post(path, json=body)
        response.raise_for_status()
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        response = self.client.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def starts(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.get(f"/workloads/{name}/events") if e["kind"] == "task-started"]

    def events(self, name: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.get(f"/workloads/{name}/events") if e["kind"] == kind]

    def throughput(self, count: int) -> float:
        """Tasks per second: `count` quarter-GPU one-liners, until all succeeded."""
        begin = time.perf_counter()
        for index in range(count):
            self.post(
                "/workloads",
                {
                    "name": f"t-{index}",
                    "project": "bench",
                    "tasks": [{"gpu": 0.25}],
                    "command": [PYTHON, "-c", "pass"],
                },
            )

        def finished() -> bool:
            counts = self.get("/cluster")["workloads"]
            return bool(counts["succeeded"] + counts["failed"] >= count)

        wait(finished, 600, "the tasks")
        return count / (time.perf_counter() - begin)

    def close(self) -> None:
        self.client.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def kill_tasks(root: Path) -> None:
    """Kill the task processes left under `root` (they name it on their command line)."""
    marker = (str(root) + "/").encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{entry}/cmdline").read_bytes():
                os.killpg(os.getpgid(int(entry)), signal.SIGKILL)


@contextmanager
def ray_cluster(racks: tuple[str, ...] = ("r1", "r1", "r2")) -> Iterator[Any]:
    """A head on 127.0.0.1 and a worker node n0, n1... on 127.0.0.2... for each of `racks`,
    with GPUS virtual GPUs each."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "node_ip_address": "127.0.0.1",
            "gcs_server_port": free_port(),
            "include_dashboard": False,
        },
    )
    try:
        for index, rack in enumerate(racks):
            cluster.add_node(
                num_cpus=1,
                node_ip_address=f"127.0.0.{index + 2}",
                resources={"corral_virtual_gpus": GPUS},
                labels={"corral.io/name": f"n{index}", "corral.io/rack": rack},
            )
        yield cluster
    finally:
        cluster.shutdown()


def measure_ray(root: Path, tasks: int) -> dict[str, float]:
    result: dict[str, float] = {}
    with ray_cluster() as cluster:
        os.environ["CORRAL_RAY_NAMESPACE"] = f"corral-bench-{os.getpid()}"
        args = ["server", "--ray", cluster.address, "--agent-dir", str(root / "agents")]
        server = Corral(args, root)
        try:
            wait(lambda: len(server.get("/nodes")) == 3, 30, "3 nodes")
            server.post("/queues", {"name": "bench", "deserved": 8})

            # Join: work waits for a node of rack "new".
            command = [PYTHON, "-c", SLEEP, "1"]
            server.post(
                "/workloads",
                {
                    "name": "waits",
                    "project": "bench",
                    "tasks": [{"gpu": 1}],
                    "command": command,
                    "node_selector": {"rack": "new"},
                },
            )
            begin = time.perf_counter()
            cluster.add_node(
                num_cpus=1,
                node_ip_address="127.0.0.5",
                resources={"corral_virtual_gpus": GPUS},
                labels={"corral.io/name": "joined", "corral.io/rack": "new"},
            )
            wait(lambda: len(server.get("/nodes")) == 4, 30, "the new node")
            result["join_to_registered_s"] = time.perf_counter() - begin
            wait(lambda: server.starts("waits"), 30, "the waiting task")
            result["join_to_first_task_s"] = time.perf_counter() - begin
            print(f"join: {result['join_to_first_task_s']:.2f} s to the first task", flush=True)

            # Loss: a 2-node gang, one of its nodes removed.
            server.post(
                "/workloads",
                {
                    "name": "gang",
                    "project": "bench",
                    "tasks": [{"replicas": 2, "gpu": GPUS}],
                    "command": [PYTHON, "-c", SLEEP, "600"],
                },
            )
            wait(lambda: len(server.starts("gang")) == 2, 30, "the gang")
            victim_name = server.get("/workloads/gang")["placements"][1]["node"]
            victim = next(
                node
                for node in cluster.worker_nodes
                if node.node_ip_address
                == {"n0": "127.0.0.2", "n1": "127.0.0.3", "n2": "127.0.0.4"}.get(victim_name)
            )
            begin = time.perf_counter()
            cluster.remove_node(victim, allow_graceful=False)
            wait(lambda: server.events("gang", "requeued"), 60, "the requeue")
            result["loss_to_requeued_s"] = time.perf_counter() - begin
            wait(lambda: len(server.starts("gang")) == 4, 60, "the gang to run again")
            result["loss_to_running_s"] = time.perf_counter() - begin
            print(
                f"loss: requeued after {result['loss_to_requeued_s']:.2f} s, running again "
                f"after {result['loss_to_running_s']:.2f} s",
                flush=True,
            )
            server.client.delete("/workloads/gang")
            server.client.delete("/workloads/waits")
            result["tasks_per_s_ray"] = server.throughput(tasks)
        finally:
            server.close()
            kill_tasks(root)
    return result


def measure_local(root: Path, tasks: int) -> float:
    server = Corral(["up", "--virtual-gpus", str(3 * GPUS)], root)
    try:
        server.post("/queues", {"name": "bench", "deserved": 8})
        return server.throughput(tasks)
    finally:
        server.close()
        kill_tasks(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tasks", type=int, default=60)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-ray-bench-"))
    (root / "ray").mkdir()
    (root / "local").mkdir()
    result = measure_ray(root / "ray", args.tasks)
    result["tasks_per_s_local"] = measure_local(root / "local", args.tasks)
    result = {key: round(value, 2) for key, value in result.items()}
    print(
        f"tasks per second: {result['tasks_per_s_ray']} through Ray, "
        f"{result['tasks_per_s_local']} in process"
    )
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
