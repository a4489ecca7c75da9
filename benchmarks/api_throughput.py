"""API throughput: submissions per second through the REST API, and submit-to-bound latency.

    python benchmarks/api_throughput.py [--json] [--backend sqlite|postgresql|both]
                                        [--count N] [--samples M] [--clients C]

For each backend the script starts its own `corral server` process (a temporary data
directory; for PostgreSQL a database on a server started with pgserver), creates a project
and registers enough virtual 8-GPU nodes for every workload to bind, then measures:

1. Submit-to-bound latency on an idle cluster: M single-GPU workloads, one at a time. Each
   is submitted, then waited for with one GET /workloads/{name}?until=running, which the
   server answers when the scheduler has bound it. Three figures: wall clock, from sending
   the POST to that answer; the store's own, started_at - created_at; and, for M more
   workloads, the wall clock of a client that polls instead (a GET every 5 ms until one
   sees it running: an upper bound by the polling interval).
2. Submissions per second from 1 client: N single-GPU workloads back to back, each POST
   waiting for its answer; then the time until all N are bound.
3. Submissions per second from C concurrent clients (16 by default), each a thread with
   its own connection, N workloads in all; then the time until all are bound.
4. The batch endpoint: B batches of S workloads each (POST /workloads/batch, one client),
   workloads per second; then the time until all are bound.
5. Reads from C concurrent clients: N GETs of single workloads (GET /workloads/{name}, a
   handler that is a plain function, run in the server's worker threads), reads per
   second.

The bursts' clients speak HTTP/1.1 with the standard library's `http.client` over one
kept-alive connection each: httpx costs about 1 ms of CPU per request, and 16 clients in
one process would then measure the client (they share the server's two cores).

Targets (issue 18): with 16 clients at least 1,500 submissions/s on SQLite and 1,000/s on
PostgreSQL; the batch endpoint at least 10,000 workloads/s; a submit-to-bound p50 under
15 ms on SQLite and 25 ms on PostgreSQL. (Slurm documents 500 simple batch jobs per
second.) The clients run on the same machine as the server and take CPU from it, so the
figures are a lower bound for the server alone.

With --json the last line is one JSON object, per backend: `submits_per_second_1`,
`submits_per_second_concurrent`, `bound_per_second_1`, `bound_per_second_concurrent`,
`latency_p50_ms`, `latency_p99_ms`, `store_latency_p50_ms`, `store_latency_p99_ms`,
`polled_latency_p50_ms`,
`batch_workloads_per_second`, `batch_bound_per_second`, `reads_per_second_concurrent`,
`cycle_seconds` (the last scheduling cycle, with every workload in the store), `nodes`;
and, where /proc tells a process's CPU time (Linux), `server_cpu_ms_per_submission` (16
clients), `server_cpu_us_per_batch_workload` and `server_cpu_ms_per_read`: the CPU time of
the server process and of its scheduler's (a child process) from a burst's first request
to its last answer (binding meanwhile included), per workload or read; and the same of
the server process alone (the API and its submission writer, one interpreter), as
`api_cpu_ms_per_submission`, `api_cpu_us_per_batch_workload` and `api_cpu_ms_per_read`.
On a machine shared with other work the rates move with its load; the CPU time much less.

With --against-bare the same run also starts `api_limit.py` (a bare FastAPI + Pydantic +
SQLAlchemy endpoint committing one row per request, on the same database kind) and
measures it with the same clients: `bare_submits_per_second_concurrent`,
`bare_post_latency_p50_ms`, and the ratios `share_of_bare_rate` (corral's rate over the
bare one's) and `post_latency_over_bare` (corral's POST p50 over the bare one's). Every
figure also carries `post_latency_p50_ms`: the POST's own answer time, one client.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench_support import postgres_url

# Issue 18's targets, by backend: submissions/s with 16 clients, submit-to-bound p50 (ms).
SUBMITS_TARGET = {"sqlite": 1500.0, "postgresql": 1000.0}
LATENCY_TARGET_MS = {"sqlite": 15.0, "postgresql": 25.0}
BATCH_TARGET = 10_000.0
GPUS_PER_NODE = 8
POLL = 0.005
CORRAL = str(Path(sys.executable).with_name("corral"))


@dataclass
class Server:
    url: str
    token: str
    process: subprocess.Popen[bytes]
    log: Path

    def connection(self) -> Connection:
        """A lean kept-alive HTTP/1.1 connection for the bursts."""
        return Connection(self.url, self.token)

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
        )

    def cpu_seconds(self) -> Cpu | None:
        """The CPU time so far (user and system) of the server process, and of the
        processes it started (its scheduler's), or None without /proc."""
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return None
        children = 0
        for path in Path("/proc").glob("[0-9]*/stat"):
            try:
                child = path.read_text()
            except OSError:
                continue  # ended meanwhile
            if int(child.rsplit(")", 1)[1].split()[1]) == self.process.pid:
                children += _ticks(child)
        tick = os.sysconf("SC_CLK_TCK")
        return _ticks(stat) / tick, children / tick


def _ticks(stat: str) -> int:
    """User and system clock ticks of a /proc/PID/stat line."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Connection:
    """POSTs of JSON over one kept-alive `http.client` connection."""

    def __init__(self, url: str, token: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.http = http.client.HTTPConnection(host, int(port), timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, path: str, body: Any) -> tuple[int, bytes]:
        return self.request("POST", path, json.dumps(body))

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path)

    def request(self, method: str, path: str, body: str | None = None) -> tuple[int, bytes]:
        self.http.request(method, f"/api/v1{path}", body, self.headers)
        response = self.http.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.http.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def corral_server(db: str | None, bare: bool = False) -> Iterator[Server]:
    """`corral server` on a free port with a temporary data directory; with `bare`, the
    bare endpoint of `api_limit.py` in its place."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as directory:
        data_dir = Path(directory)
        port = free_port()
        log = data_dir / "server.log"
        args = [CORRAL, "server", "--data-dir", str(data_dir), "--port", str(port)]
        if bare:
            limit = str(Path(__file__).with_name("api_limit.py"))
            args = [sys.executable, limit, "--data-dir", str(data_dir), "--port", str(port)]
        if db:
            args += ["--db", db]
        with open(log, "wb") as handle:
            # Every client shares the admin's token: its write limit (200/s by default)
            # would measure itself, not the server.
            env = {**os.environ, "CORRAL_WRITE_RATE": "0"}
            process = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"corral server exited:\n{log.read_text()}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"corral server did not start:\n{log.read_text()}")
                time.sleep(0.1)
            while not (data_dir / "admin-token").exists():
                time.sleep(0.05)
            token = (data_dir / "admin-token").read_text().strip()
            yield Server(url, token, process, log)
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def expect(response: httpx.Response, status: int) -> dict[str, Any]:
    if response.status_code != status:
        raise RuntimeError(
            f"{response.request.method} {response.request.url} -> "
            f"{response.status_code}: {response.text[:500]}"
        )
    body: dict[str, Any] = response.json()
    return body


def prepare(server: Server, workloads: int) -> int:
    """A project deserving every GPU (of a cluster of up to 100,000), and nodes for
    `workloads` single-GPU workloads. Returns how many nodes."""
    with server.client() as client:
        expect(client.post("/queues", json={"name": "bench", "deserved": 100_000}), 201)
    return add_nodes(server, 0, workloads)


def add_nodes(server: Server, first: int, workloads: int) -> int:
    """Register nodes (named from node-`first`) for `workloads` more single-GPU
    workloads. Returns how many."""
    nodes = math.ceil(workloads / GPUS_PER_NODE) + 1
    with server.client() as client:
        for index in range(first, first + nodes):
            body = {"name": f"node-{index}", "gpus": GPUS_PER_NODE, "virtual": True}
            expect(client.post("/nodes", json=body), 201)
    return nodes


SUBMISSION = {"project": "bench", "tasks": [{"gpu": 1}], "command": ["sleep", "infinity"]}
# Each backend's server is new: its workloads are named w-0, w-1, ... (`first_names`).
_names = itertools.count()


def submission() -> dict[str, Any]:
    """A single-GPU workload. Named by the client: names the server makes up have 24
    random bits and collide (409) about once in 2,000 submissions per project."""
    return {**SUBMISSION, "name": f"w-{next(_names)}"}


def first_names() -> None:
    """Name the next workloads from w-0 again (for a new server)."""
    global _names
    _names = itertools.count()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]


def measure_latency(server: Server, samples: int) -> dict[str, float]:
    wall: list[float] = []
    posted: list[float] = []
    stored: list[float] = []
    polled: list[float] = []
    with server.client() as client:
        for _ in range(samples):
            sent = time.perf_counter()
            name = expect(client.post("/workloads", json=submission()), 201)["name"]
            posted.append(time.perf_counter() - sent)
            until = {"until": "running", "wait": 30}
            workload = expect(client.get(f"/workloads/{name}", params=until), 200)
            if workload["status"] != "running":
                raise RuntimeError(f"{name} was not bound within 30 s: {workload}")
            wall.append(time.perf_counter() - sent)
            stored.append(workload["started_at"] - workload["created_at"])
        for _ in range(samples):
            sent = time.perf_counter()
            name = expect(client.post("/workloads", json=submission()), 201)["name"]
            while True:
                workload = expect(client.get(f"/workloads/{name}"), 200)
                if workload["status"] == "running":
                    polled.append(time.perf_counter() - sent)
                    break
                if time.perf_counter() - sent > 30:
                    raise RuntimeError(f"{name} was not bound within 30 s: {workload}")
                time.sleep(POLL)
    return {
        "post_latency_p50_ms": 1000 * statistics.median(posted),
        "latency_p50_ms": 1000 * statistics.median(wall),
        "latency_p99_ms": 1000 * percentile(wall, 0.99),
        "store_latency_p50_ms": 1000 * statistics.median(stored),
        "store_latency_p99_ms": 1000 * percentile(stored, 0.99),
        "polled_latency_p50_ms": 1000 * statistics.median(polled),
    }


def running_count(client: httpx.Client) -> int:
    count: int = expect(client.get("/cluster"), 200)["workloads"]["running"]
    return count


# CPU seconds of the server process (the API, its submission writer) and of its children
# (the scheduler).
Cpu = tuple[float, float]
Burst = tuple[float, float, Cpu | None]


def per_item(server: Server, cpu_before: Cpu | None, count: int) -> Cpu | None:
    """The server's and its children's CPU seconds per item since `cpu_before`."""
    cpu = server.cpu_seconds()
    if cpu is None or cpu_before is None:
        return None
    return (cpu[0] - cpu_before[0]) / count, (cpu[1] - cpu_before[1]) / count


def concurrently(
    server: Server,
    count: int,
    clients: int,
    request: Callable[[Connection], tuple[int, bytes]],
    expected: int,
) -> tuple[float, float, Cpu | None]:
    """`count` requests from `clients` threads, each with its own connection, each to be
    answered `expected`. Returns when the first was sent (perf_counter), the seconds until
    the last answer, and the server's CPU seconds per request meanwhile (None without
    /proc)."""
    shares = [count // clients + (1 if i < count % clients else 0) for i in range(clients)]
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)

    def client(share: int) -> None:
        connection = server.connection()
        try:
            barrier.wait()
            for _ in range(share):
                status, answer = request(connection)
                if status != expected:
                    errors.append(f"{status}: {answer[:300]!r}")
                    return
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    barrier.wait()
    cpu = server.cpu_seconds()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - start
    cpu = per_item(server, cpu, count)
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
    return start, took, cpu


def submit_burst(server: Server, count: int, clients: int) -> Burst:
    """Submit `count` workloads from `clients` threads. Returns submissions per second,
    workloads bound per second (from the first submission until all of them run), and
    the server's CPU seconds per submission until the last answer (None without /proc)."""
    with server.client() as client:
        before = running_count(client)

    def submit(connection: Connection) -> tuple[int, bytes]:
        return connection.post("/workloads", submission())

    start, submitted, cpu = concurrently(server, count, clients, submit, 201)
    return count / submitted, count / (wait_bound(server, before + count) - start), cpu


def read_burst(server: Server, count: int, clients: int) -> tuple[float, Cpu | None]:
    """GET `count` workloads, the first ones submitted to this server (w-0 on, at most
    500 of them), one at a time from each of `clients` threads. Returns reads per second
    and the server's CPU seconds per read (None without /proc)."""
    names = itertools.cycle([f"w-{index}" for index in range(min(count, 500))])

    def read(connection: Connection) -> tuple[int, bytes]:
        return connection.get(f"/workloads/{next(names)}")

    _, took, cpu = concurrently(server, count, clients, read, 200)
    return count / took, cpu


def wait_bound(server: Server, running: int) -> float:
    """When `running` workloads run (perf_counter)."""
    started = time.perf_counter()
    with server.client() as client:
        while running_count(client) < running:
            if time.perf_counter() - started > 600:
                raise RuntimeError("the submitted work was not bound within 10 minutes")
            time.sleep(0.25)  # /cluster reads every workload; asking often slows the server
    return time.perf_counter()


def submit_batches(server: Server, batches: int, size: int) -> Burst:
    """Submit `batches` batches of `size` workloads through POST /workloads/batch, one
    after another from one client. Returns workloads submitted per second, workloads
    bound per second (from the first batch until all of them run), and the server's CPU
    seconds per workload until the last answer (None without /proc)."""
    with server.client() as client:
        before = running_count(client)
    bodies = [{"workloads": [submission() for _ in range(size)]} for _ in range(batches)]
    connection = server.connection()
    total = batches * size
    try:
        cpu = server.cpu_seconds()
        start = time.perf_counter()
        for body in bodies:
            status, answer = connection.post("/workloads/batch", body)
            if status != 201:
                raise RuntimeError(f"a batch failed: {status}: {answer[:300]!r}")
        submitted = time.perf_counter() - start
        cpu = per_item(server, cpu, total)
    finally:
        connection.close()
    return total / submitted, total / (wait_bound(server, before + total) - start), cpu


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_bare(db: str | None, count: int, samples: int, clients: int) -> dict[str, float]:
    """The bare endpoint of `api_limit.py` under the same clients: POST latency of one
    client (p50, httpx as for corral's), then submissions per second of `clients`."""
    with corral_server(db, bare=True) as server:
        first_names()
        posted = []
        with server.client() as client:
            for _ in range(samples):
                sent = time.perf_counter()
                expect(client.post("/workloads", json=submission()), 201)
                posted.append(time.perf_counter() - sent)

        def submit(connection: Connection) -> tuple[int, bytes]:
            return connection.post("/workloads", submission())

        _, took, _ = concurrently(server, count, clients, submit, 201)
        return {
            "post_latency_p50_ms": 1000 * statistics.median(posted),
            "submits_per_second_concurrent": count / took,
        }


def run_backend(
    backend: str,
    count: int,
    samples: int,
    clients: int,
    batches: int,
    batch_size: int,
    bare: bool = False,
) -> dict[str, float]:
    def measure(db: str | None) -> dict[str, float]:
        figures = measure_corral(db)
        if bare:
            limit = measure_bare(db, count, samples, clients)
            progress(f"{backend}: bare endpoint {limit}")
            figures["bare_submits_per_second_concurrent"] = limit["submits_per_second_concurrent"]
            figures["bare_post_latency_p50_ms"] = limit["post_latency_p50_ms"]
            figures["share_of_bare_rate"] = (
                figures["submits_per_second_concurrent"] / limit["submits_per_second_concurrent"]
            )
            figures["post_latency_over_bare"] = (
                figures["post_latency_p50_ms"] / limit["post_latency_p50_ms"]
            )
        return figures

    def measure_corral(db: str | None) -> dict[str, float]:
        with corral_server(db) as server:
            first_names()
            started = time.perf_counter()
            nodes = prepare(server, 2 * samples + 2 * count)
            took = time.perf_counter() - started
            progress(f"{backend}: {nodes} nodes registered in {took:.1f} s")
            figures = measure_latency(server, samples)
            figures["nodes"] = nodes
            progress(f"{backend}: latency {figures}")
            one, one_bound, _ = submit_burst(server, count, 1)
            progress(f"{backend}: 1 client {one:.0f}/s, bound {one_bound:.0f}/s")
            many, many_bound, many_cpu = submit_burst(server, count, clients)
            progress(f"{backend}: {clients} clients {many:.0f}/s, bound {many_bound:.0f}/s")
            # Nodes for the batches only now: the figures above keep their cluster's size.
            nodes += add_nodes(server, nodes, batches * batch_size)
            batch, batch_bound, batch_cpu = submit_batches(server, batches, batch_size)
            progress(f"{backend}: batches {batch:.0f}/s, bound {batch_bound:.0f}/s")
            reads, read_cpu = read_burst(server, count, clients)
            progress(f"{backend}: {clients} clients {reads:.0f} reads/s")
            if many_cpu is not None and batch_cpu is not None and read_cpu is not None:
                figures["server_cpu_ms_per_submission"] = 1000 * sum(many_cpu)
                figures["server_cpu_us_per_batch_workload"] = 1_000_000 * sum(batch_cpu)
                figures["server_cpu_ms_per_read"] = 1000 * sum(read_cpu)
                # The server process's own share (the rest is its scheduler's).
                figures["api_cpu_ms_per_submission"] = 1000 * many_cpu[0]
                figures["api_cpu_us_per_batch_workload"] = 1_000_000 * batch_cpu[0]
                figures["api_cpu_ms_per_read"] = 1000 * read_cpu[0]
            with server.client() as client:
                cycle = expect(client.get("/cluster"), 200)["last_cycle_seconds"]
            figures.update(
                submits_per_second_1=one,
                bound_per_second_1=one_bound,
                submits_per_second_concurrent=many,
                bound_per_second_concurrent=many_bound,
                batch_workloads_per_second=batch,
                batch_bound_per_second=batch_bound,
                reads_per_second_concurrent=reads,
                cycle_seconds=cycle,
            )
            return figures

    if backend == "postgresql":
        with postgres_url() as url:
            return measure(url)
    return measure(None)


def table(results: dict[str, dict[str, float]], clients: int) -> list[str]:
    """One line per figure: value, target, and the ratio to the target (>= 1 meets it)."""
    rate = "{:,.1f}".format
    ms = "{:.1f} ms".format
    lines = [f"{'backend':<11}{'figure':<36}{'value':>12}{'target':>10}{'ratio':>10}"]
    for backend, figures in results.items():
        submits, latency = SUBMITS_TARGET[backend], LATENCY_TARGET_MS[backend]
        rows: list[tuple[str, str, Callable[[float], str], float | None, bool]] = [
            ("submissions/s, 1 client", "submits_per_second_1", rate, None, True),
            (f"submissions/s, {clients} clients", "submits_per_second_concurrent", rate,
             submits, True),
            ("submitted+bound/s, 1 client", "bound_per_second_1", rate, None, True),
            (f"submitted+bound/s, {clients} clients", "bound_per_second_concurrent", rate,
             None, True),
            ("batch endpoint, workloads/s", "batch_workloads_per_second", rate, BATCH_TARGET,
             True),
            ("batch endpoint, bound/s", "batch_bound_per_second", rate, None, True),
            (f"reads/s, {clients} clients", "reads_per_second_concurrent", rate, None, True),
            ("submit-to-bound p50, wall clock", "latency_p50_ms", ms, latency, False),
            ("submit-to-bound p99, wall clock", "latency_p99_ms", ms, None, False),
            ("submit-to-bound p50, store times", "store_latency_p50_ms", ms, None, False),
            ("submit-to-bound p99, store times", "store_latency_p99_ms", ms, None, False),
            ("submit-to-bound p50, polling", "polled_latency_p50_ms", ms, None, False),
        ]  # fmt: skip
        for label, key, show, target, higher_is_better in rows:
            value = figures[key]
            goal = ratio = ""
            if target is not None:
                goal = f">= {target:g}" if higher_is_better else f"< {target:g} ms"
                share = value / target if higher_is_better else target / value
                ratio = f"{share:.3g}x"
            lines.append(f"{backend:<11}{label:<36}{show(value):>12}{goal:>10}{ratio:>10}")
        cycle = f"{1000 * figures['cycle_seconds']:.1f} ms"
        lines.append(f"{backend:<11}{'last cycle, all work in the store':<36}{cycle:>12}")
        if "server_cpu_ms_per_submission" in figures:
            for label, key, unit in (
                (f"CPU/submission, {clients} clients", "cpu_ms_per_submission", "ms"),
                ("CPU/workload, batch endpoint", "cpu_us_per_batch_workload", "us"),
                (f"CPU/read, {clients} clients", "cpu_ms_per_read", "ms"),
            ):
                places = 3 if unit == "ms" else 1
                cpu = f"{figures[f'server_{key}']:.{places}f} {unit}"
                lines.append(f"{backend:<11}{f'server {label}':<36}{cpu:>12}")
                cpu = f"{figures[f'api_{key}']:.{places}f} {unit}"
                lines.append(f"{backend:<11}{'  of it, the API process':<36}{cpu:>12}")
        nodes = f"{figures['nodes']:.0f} x 8 GPUs"
        lines.append(f"{backend:<11}{'nodes':<36}{nodes:>12}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--count", type=int, default=500, help="submissions per burst")
    parser.add_argument("--samples", type=int, default=100, help="latency samples")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--batches", type=int, default=10, help="batches for the batch figure")
    parser.add_argument("--batch-size", type=int, default=1000, help="workloads per batch")
    parser.add_argument(
        "--against-bare",
        action="store_true",
        help="also measure api_limit.py's bare endpoint in this run, and the ratios",
    )
    args = parser.parse_args()

    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    results = {}
    for backend in backends:
        print(f"{backend}: {args.count} submissions per burst, {args.samples} latency samples",
              file=sys.stderr, flush=True)  # fmt: skip
        results[backend] = run_backend(
            backend,
            args.count,
            args.samples,
            args.clients,
            args.batches,
            args.batch_size,
            args.against_bare,
        )
    print(f"machine: {os.cpu_count()} CPUs; clients and server share them")
    for line in table(results, args.clients):
        print(line)
    print("ratio: value / target for rates, target / value for latencies; >= 1x meets it")
    for backend, figures in results.items():
        if "share_of_bare_rate" in figures:
            print(
                f"{backend} against the bare endpoint (api_limit.py), same clients, this run: "
                f"{figures['submits_per_second_concurrent']:,.0f} of "
                f"{figures['bare_submits_per_second_concurrent']:,.0f} submissions/s "
                f"({figures['share_of_bare_rate']:.0%}; goal >= 50%), POST p50 "
                f"{figures['post_latency_p50_ms']:.1f} against "
                f"{figures['bare_post_latency_p50_ms']:.1f} ms "
                f"({figures['post_latency_over_bare']:.2f}x; goal <= 2x)"
            )
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        print(
            json.dumps(
                {
                    backend: {key: round(value, 4) for key, value in figures.items()}
                    for backend, figures in results.items()
                }
            )
        )


if __name__ == "__main__":
    main()
