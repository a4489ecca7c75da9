"""The control plane at cluster scale: 1,000 nodes x 8 GPUs, 20,000 workloads.

    python benchmarks/control_plane_scale.py [--json] [--nodes N] [--workloads W]

Runs the real server in this process (store on SQLite, scheduler loop, dispatcher and its
reconciler, the REST API under uvicorn on 127.0.0.1) with a lightweight agent double in
place of the agents: a `corral.cluster.Cluster` that accepts starts and stops, reports
each task started at once and ended (exit 0) after its run time of 2 to 6 s, and
heartbeats every node every 5 s. W workloads of mixed shapes (1, 2 and 4 GPUs, half a
GPU, 2 x 8-GPU gangs) are submitted through the API from 8 client threads, in 2
processes of their own.

Measured: `bind_all_s`, from the first submission until every workload has been bound
(running or done); `cycle_s_p95`, the 95th percentile of the scheduler's cycle time
while it works; `reconcile_s_p95`, the 95th percentile of one reconciler pass over every
node, timed on the server's own store and cluster while the work runs. Goals: a cycle
under 2 s and a pass under 1 s. With --json the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import atexit
import heapq
import itertools
import json
import os
import random
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from corral.messages import Reports, TaskLaunch, TaskStop
from corral.model import GIB, Node
from corral.model.spec import Device, NodeSpec
from corral.server.app import create_app
from corral.server.main import open_store, tune_interpreter
from corral.store import Store

GPUS_PER_NODE = 8
CLIENTS = 8
# The client threads are spread over this many processes.
CLIENT_PROCESSES = 2
# (share of the workloads, replicas, GPUs per task)
SHAPES = [(0.45, 1, 1.0), (0.2, 1, 2.0), (0.15, 1, 4.0), (0.1, 1, 0.5), (0.1, 2, 8.0)]


class AgentDouble:
    """Every node's agent, as a Cluster: starts and stops are accepted and reported from
    a thread of its own, like agents that answer quickly."""

    def __init__(self, nodes: list[str], seed: int = 7) -> None:
        self.nodes = nodes
        self.reports: Reports | None = None
        self._running: dict[str, set[tuple[str, int]]] = defaultdict(set)
        self._lock = threading.Lock()
        self._due: list[tuple[float, int, str, str, int]] = []  # (end, seq, node, w, t)
        self._started: list[tuple[str, str, int]] = []
        self._ended: list[tuple[str, str, int, int | None, str]] = []
        self._seq = itertools.count()
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._report, daemon=True)
        self._ports = itertools.count(20000)
        # Where each task was last started: the end of a task stopped on a node it has
        # since left (consolidation moved it) is not reported, as RayCluster does.
        self._latest: dict[tuple[str, int], str] = {}
        # The attempt each running task was launched for, reported with its end as agents
        # do: the end of an earlier attempt is not taken for the current one's.
        self._attempts: dict[tuple[str, str, int], int] = {}

    def connect(self, reports: Reports) -> None:
        self.reports = reports
        self._thread.start()

    def start(self, launches: list[TaskLaunch]) -> None:
        with self._lock:
            for launch in launches:
                if launch.key in self._running[launch.node]:
                    continue
                self._running[launch.node].add(launch.key)
                self._latest[launch.key] = launch.node
                self._attempts[(launch.node, *launch.key)] = launch.attempt
                self._started.append((launch.node, launch.workload, launch.task))
                end = time.monotonic() + self._random.uniform(2, 6)
                item = (end, next(self._seq), launch.node, launch.workload, launch.task)
                heapq.heappush(self._due, item)

    def stop(self, stops: list[TaskStop]) -> None:
        with self._lock:
            for stop in stops:
                for task in stop.tasks:
                    key = (stop.workload, task)
                    if key in self._running[stop.node]:
                        self._running[stop.node].discard(key)
                        attempt = self._attempts.pop((stop.node, *key), None)
                        if self._latest.get(key) == stop.node:
                            self._ended.append(
                                (stop.node, stop.workload, task, attempt, stop.reason)
                            )

    def running(self, node: str) -> set[tuple[str, int]] | None:
        with self._lock:
            return set(self._running[node])

    def strays(self, node: str) -> set[tuple[str, int]]:
        # The double's agents never restart, so nothing runs from before them.
        return set()

    def rendezvous(self, workload: str, attempt: int, node: str) -> tuple[str, int]:
        return "", 20000 + next(self._ports) % 40000

    def close(self) -> None:
        self._stop.set()

    def _report(self) -> None:
        assert self.reports is not None
        reports = self.reports
        beat = 0.0
        while not self._stop.wait(0.05):
            now = time.monotonic()
            with self._lock:
                started, self._started = self._started, []
                # (node, workload, task, exit code, why, attempt)
                ended: list[tuple[str, str, int, int | None, str, int | None]] = [
                    (n, w, t, None, why, attempt) for n, w, t, attempt, why in self._ended
                ]
                self._ended = []
                while self._due and self._due[0][0] <= now:
                    _, _, node, workload, task = heapq.heappop(self._due)
                    if (workload, task) in self._running[node]:
                        self._running[node].discard((workload, task))
                        attempt = self._attempts.pop((node, workload, task), None)
                        ended.append((node, workload, task, 0, "exited with code 0", attempt))
            for node, workload, task in started:
                reports.task_started(node, workload, task, 1000, 1)
            for node, workload, task, code, why, attempt in ended:
                reports.task_ended(node, workload, task, code, why, attempt)
            if now - beat > 5:
                beat = now
                for node in self.nodes:
                    reports.heartbeat(node)


def register(store: Store, count: int) -> list[str]:
    names = [f"node-{index:04d}" for index in range(count)]
    for name in names:
        devices = tuple(
            Device(i, f"{name}-{i}", "virtual", 80 * GIB, virtual=True)
            for i in range(GPUS_PER_NODE)
        )
        node = Node(name=name, gpus=GPUS_PER_NODE, gpu_memory=80 * GIB, gpu_model="virtual")
        store.register_node(NodeSpec(node, devices, virtual=True))
    return names


def workloads(count: int, seed: int = 11) -> list[dict[str, Any]]:
    chooser = random.Random(seed)
    weights = [share for share, _, _ in SHAPES]
    bodies = []
    for index in range(count):
        _, replicas, gpu = chooser.choices(SHAPES, weights)[0]
        bodies.append(
            {
                "name": f"w-{index}",
                "project": "bench",
                "tasks": [{"replicas": replicas, "gpu": gpu}],
                "command": ["true"],
            }
        )
    return bodies


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--workloads", type=int, default=20000)
    parser.add_argument(
        "--max-seconds", type=float, default=1200, help="give up binding after this long"
    )
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="corral-scale-"))
    # Removed when the script ends, however it ends (the server's thread is a daemon).
    atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
    store, _ = open_store(data_dir, None)
    token = (data_dir / "admin-token").read_text().strip()
    started = time.perf_counter()
    names = register(store, args.nodes)
    print(f"{args.nodes} nodes registered in {time.perf_counter() - started:.1f} s", flush=True)
    double = AgentDouble(names)
    # One token submits everything: the per-token write limit would measure itself.
    os.environ.setdefault("CORRAL_WRITE_RATE", "0")
    app = create_app(store, cluster=double, data_dir=data_dir)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    # As `corral server` sets up its process.
    tune_interpreter()
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}/api/v1"
    headers = {"Authorization": f"Bearer {token}"}
    total_gpus = args.nodes * GPUS_PER_NODE
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        client.post("/queues", json={"name": "bench", "deserved": total_gpus}).raise_for_status()

    loop = app.state.control.loop
    cycles: list[float] = []
    passes: list[float] = []
    done = threading.Event()

    def watch_cycles() -> None:
        seen = loop.cycles
        while not done.wait(0.02):
            if loop.cycles != seen and loop.last_seconds is not None:
                seen = loop.cycles
                cycles.append(loop.last_seconds)

    def time_reconciler() -> None:
        # The server's own reconciler (beside its monitor's passes), while work runs: it
        # writes the reports received before it reads what the store binds.
        reconciler = app.state.control.dispatcher
        assert reconciler is not None
        while not done.wait(2.0):
            begin = time.perf_counter()
            reconciler.reconcile()
            passes.append(time.perf_counter() - begin)

    threading.Thread(target=watch_cycles, daemon=True).start()
    threading.Thread(target=time_reconciler, daemon=True).start()

    bodies = workloads(args.workloads)
    shares = [bodies[i::CLIENTS] for i in range(CLIENTS)]
    # The clients run in processes of their own: in the server's they would take its
    # interpreter (the GIL) from it, and measure themselves. Started before the clock.
    with ProcessPoolExecutor(CLIENT_PROCESSES, mp_context=get_context("spawn")) as pool:
        list(pool.map(len, [[]] * CLIENT_PROCESSES))
        begin = time.perf_counter()
        groups = [shares[i::CLIENT_PROCESSES] for i in range(CLIENT_PROCESSES)]
        errors = [
            error
            for found in pool.map(submit_all, [base] * len(groups), [token] * len(groups), groups)
            for error in found
        ]
    # Submission rate (the API and per-workload write transactions) bounds bind_all_s.
    submitted_s = time.perf_counter() - begin
    print(f"{args.workloads} submitted in {submitted_s:.1f} s ({len(errors)} errors)", flush=True)
    bind_all: float | None = None
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        while True:
            counts = client.get("/cluster").json()["workloads"]
            bound = args.workloads - counts.get("pending", 0)
            if bound >= args.workloads:
                bind_all = time.perf_counter() - begin
                break
            print(f"  {time.perf_counter() - begin:.0f} s: {counts}", flush=True)
            if time.perf_counter() - begin > args.max_seconds:
                break
            time.sleep(5.0)
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        failed = client.get("/workloads", params={"status": "failed", "limit": 3}).json()
    for record in failed[:3] if isinstance(failed, list) else failed.get("items", [])[:3]:
        print(f"  failed: {record['name']}: {record['reason']}", flush=True)
    done.set()
    server.should_exit = True
    result = {
        "nodes": args.nodes,
        "gpus": total_gpus,
        "workloads": args.workloads,
        "submit_s": round(submitted_s, 2),
        "bind_all_s": round(bind_all, 2) if bind_all is not None else None,
        "bound": bound,
        "cycles": len(cycles),
        "cycle_s_p50": round(statistics.median(cycles), 3) if cycles else None,
        "cycle_s_p95": round(percentile(cycles, 0.95), 3),
        "cycle_s_max": round(max(cycles), 3) if cycles else None,
        "reconcile_passes": len(passes),
        "reconcile_s_p50": round(statistics.median(passes), 3) if passes else None,
        "reconcile_s_p95": round(percentile(passes, 0.95), 3),
    }
    print(
        f"bound {bound} of {args.workloads} in {time.perf_counter() - begin:.1f} s; "
        f"cycle p95 {result['cycle_s_p95']} s (goal < 2 s); "
        f"reconcile pass p95 {result['reconcile_s_p95']} s (goal < 1 s)"
    )
    if args.json:
        print(json.dumps(result))


def submit_all(base: str, token: str, shares: list[list[dict[str, Any]]]) -> list[str]:
    """Submit each share from a thread of its own; the errors answered."""
    errors: list[str] = []

    def submit(share: list[dict[str, Any]]) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
            for body in share:
                response = client.post("/workloads", json=body)
                if response.status_code != 201:
                    errors.append(response.text[:200])

    threads = [threading.Thread(target=submit, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


if __name__ == "__main__":
    main()
