"""The workspace proxy's cost: throughput (MB/s) and added latency per request, against a
direct connection to the same program.

    python benchmarks/proxy.py [--json] [--size MIB] [--requests N] [--rounds R]

The script starts its own `corral up --virtual-gpus 1` (a temporary data directory) and a
workspace whose task serves, with Python's http.server, one file of SIZE MiB (64 by
default) and a small one. It asks the task's port with `corral exec` and then measures,
through http://SERVER/w/bench/ and directly at http://127.0.0.1:PORT/:

1. Throughput: the large file downloaded R times (3 by default), streamed and discarded;
   the best of the rounds, in MB/s (10^6 bytes per second).
2. Latency: N requests (300 by default) for the small file, one after another on one
   kept-alive connection; the median and the 99th percentile, in milliseconds. The added
   latency is the proxy's median minus the direct one.

Everything runs on one machine: the client, the server and the task share its CPUs, so the
figures are a lower bound for the proxy alone. With --json the last line is one JSON
object: `direct_mb_s`, `proxy_mb_s`, `direct_p50_ms`, `direct_p99_ms`, `proxy_p50_ms`,
`proxy_p99_ms`, `added_latency_ms`, `server_p50_ms` (GET /healthz: the server's own
round trip), `lookup_p50_ms` (GET /api/v1/workspaces/bench: a request that reads the
workspace from the store, as the proxy does), `size_mib`, `requests`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

CORRAL = str(Path(sys.executable).with_name("corral"))
SERVE = (
    'head -c "$SIZE" /dev/zero > big.bin && echo ok > small.txt && '
    'exec "$0" -m http.server --bind "$CORRAL_HOST" "$CORRAL_PORT"'
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            value = check()
            if value:
                return value
        time.sleep(0.2)
    sys.exit(f"timed out waiting for {what}")


def throughput(client: httpx.Client, url: str, rounds: int) -> float:
    """The best of `rounds` downloads of `url`, in MB/s."""
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        size = 0
        with client.stream("GET", url) as answer:
            answer.raise_for_status()
            for chunk in answer.iter_raw():
                size += len(chunk)
        best = max(best, size / (time.perf_counter() - started) / 1e6)
    return best


def latencies(client: httpx.Client, url: str, count: int) -> list[float]:
    """Milliseconds per request for `count` requests of `url`, one after another."""
    client.get(url).raise_for_status()  # the connection is open before the clock starts
    found = []
    for _ in range(count):
        started = time.perf_counter()
        client.get(url).raise_for_status()
        found.append((time.perf_counter() - started) * 1000)
    return found


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(size_mib: int, requests: int, rounds: int) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="corral-proxy-bench-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    as_root = ["--admin-unix-user", "root"] if os.geteuid() == 0 else []
    more = ["--port", str(port), *as_root]
    log = open(data_dir.parent / f"{data_dir.name}.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [CORRAL, "up", "--virtual-gpus", "1", "--data-dir", str(data_dir / "data"), *more],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: httpx.get(f"{url}/healthz", trust_env=False).status_code == 200, 60, "corral up"
        )
        token = (data_dir / "data" / "admin-token").read_text().strip()
        env = {**os.environ, "CORRAL_SERVER": url, "CORRAL_TOKEN": token, "HOME": str(data_dir)}
        subprocess.run(
            [CORRAL, "project", "create", "bench", "--deserved", "1"],
            env=env,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                CORRAL,
                "workspace",
                "create",
                "bench",
                "-p",
                "bench",
                "-e",
                f"SIZE={size_mib << 20}",
                "--",
                "/bin/sh",
                "-c",
                SERVE,
                sys.executable,
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        asked = subprocess.run(
            [CORRAL, "exec", "bench", "--", "/bin/sh", "-c", "echo $CORRAL_PORT"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        direct = f"http://127.0.0.1:{int(asked.stdout)}"
        proxied = f"{url}/w/bench"
        headers = {"Authorization": f"Bearer {token}"}
        with (
            httpx.Client(trust_env=False, timeout=120) as plain,
            httpx.Client(trust_env=False, timeout=120, headers=headers) as through,
        ):
            wait_for(lambda: plain.get(f"{direct}/small.txt").status_code == 200, 60, "the task")
            direct_mb_s = throughput(plain, f"{direct}/big.bin", rounds)
            proxy_mb_s = throughput(through, f"{proxied}/big.bin", rounds)
            direct_ms = latencies(plain, f"{direct}/small.txt", requests)
            proxy_ms = latencies(through, f"{proxied}/small.txt", requests)
            server_ms = latencies(through, f"{url}/healthz", requests)
            lookup_ms = latencies(through, f"{url}/api/v1/workspaces/bench", requests)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        log.close()
        # The task's process group is its own: stop it by its launcher, found by our dir.
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if str(data_dir).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                        os.killpg(int(entry), signal.SIGKILL)
    direct_p50, proxy_p50 = statistics.median(direct_ms), statistics.median(proxy_ms)
    return {
        "direct_mb_s": round(direct_mb_s, 1),
        "proxy_mb_s": round(proxy_mb_s, 1),
        "direct_p50_ms": round(direct_p50, 3),
        "direct_p99_ms": round(percentile(direct_ms, 0.99), 3),
        "proxy_p50_ms": round(proxy_p50, 3),
        "proxy_p99_ms": round(percentile(proxy_ms, 0.99), 3),
        "added_latency_ms": round(proxy_p50 - direct_p50, 3),
        "server_p50_ms": round(statistics.median(server_ms), 3),
        "lookup_p50_ms": round(statistics.median(lookup_ms), 3),
        "size_mib": size_mib,
        "requests": requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--size", type=int, default=64, help="MiB of the large file")
    parser.add_argument("--requests", type=int, default=300, help="small requests timed")
    parser.add_argument("--rounds", type=int, default=3, help="downloads of the large file")
    options = parser.parse_args()
    found = run(options.size, options.requests, options.rounds)
    print(f"throughput: direct {found['direct_mb_s']} MB/s, proxy {found['proxy_mb_s']} MB/s")
    print(
        f"latency p50: direct {found['direct_p50_ms']} ms, proxy {found['proxy_p50_ms']} ms "
        f"(added {found['added_latency_ms']} ms); p99: direct {found['direct_p99_ms']} ms, "
        f"proxy {found['proxy_p99_ms']} ms"
    )
    if options.json:
        print(json.dumps(found))


if __name__ == "__main__":
    main()
