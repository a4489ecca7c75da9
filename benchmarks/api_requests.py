"""API requests counted in CPU instructions: what one request costs the server, steady
whatever the machine's load (the rates of `api_throughput.py` move by a quarter between
runs minutes apart on a shared 2-core machine; these counts by a few percent at most).

    python benchmarks/api_requests.py [--json] [--requests N]

Each case runs in a process of its own under valgrind's callgrind (`apt-get install
valgrind`), twice: once with N requests and once with none, the same set-up either way,
so that the difference divided by N is one request's instructions (with Python's string
hashing fixed, which otherwise moves them), every thread of the server process counted
(the event loop, worker threads, the submission writer; no scheduler runs). Requests are
made straight through the application's ASGI interface, with no HTTP and no network: the
figure is the application's (routing, middleware, authentication, validation, the
handler, the store, the answer), not uvicorn's, and not a client's: the requests are
handed to the application as ASGI messages made here, since httpx's ASGI transport would
add its own work to every request counted.

Cases: GET /healthz; GET /api/v1/whoami; GET /api/v1/workloads/NAME; POST
/api/v1/workloads (a single-GPU workload); POST /api/v1/workloads/batch, per workload
of batches of 1,000. With --json the last line is one JSON object of instructions per
request (per workload for the batch) by case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from api_throughput import submission

BATCH = 1000
CASES = {
    "healthz": ("GET", "/healthz"),
    "whoami": ("GET", "/api/v1/whoami"),
    "get_workload": ("GET", "/api/v1/workloads/seed-0"),
    "submit": ("POST", "/api/v1/workloads"),
    "batch_per_workload": ("POST", "/api/v1/workloads/batch"),
}


def child(case: str, requests: int) -> None:
    """Serve the case's requests in this process (run under callgrind by `instructions`)."""
    # Every request comes with the admin's token: its write limit would refuse them.
    os.environ["CORRAL_WRITE_RATE"] = "0"
    from starlette.types import Message

    from corral.server.app import create_app
    from corral.server.main import open_store

    with tempfile.TemporaryDirectory(prefix="corral-bench-") as directory:
        store, token = open_store(Path(directory), None)
        app = create_app(store, run_scheduler=False)
        headers = [(b"authorization", f"Bearer {token}".encode()), (b"host", b"bench")]

        async def call(method: str, path: str, body: Any = None) -> int:
            raw = b"" if body is None else json.dumps(body).encode()
            extra = [(b"content-type", b"application/json")] if body is not None else []
            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": method,
                "scheme": "http",
                "path": path,
                "raw_path": path.encode(),
                "query_string": b"",
                "root_path": "",
                "headers": [*headers, *extra, (b"content-length", str(len(raw)).encode())],
                "client": ("127.0.0.1", 50000),
                "server": ("127.0.0.1", 80),
                "state": {},
            }
            sent = False
            answer: list[Message] = []

            async def receive() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": raw, "more_body": False}
                await asyncio.Event().wait()  # the client stays: never disconnects
                raise AssertionError("unreachable")

            async def send(message: Message) -> None:
                answer.append(message)

            await app(scope, receive, send)
            status: int = answer[0]["status"]
            if status >= 300:
                raise RuntimeError(f"{method} {path} -> {status}: {answer[1:]}")
            return status

        def body() -> Any:
            if case == "submit":
                return submission()
            if case == "batch_per_workload":
                return {"workloads": [submission() for _ in range(BATCH)]}
            return None

        async def run() -> None:
            async with app.router.lifespan_context(app):
                await call("POST", "/api/v1/queues", {"name": "bench", "deserved": 100_000})
                seed = {**submission(), "name": "seed-0"}
                await call("POST", "/api/v1/workloads", seed)
                method, path = CASES[case]
                # Warm up (the first request of a route builds what later ones reuse).
                for _ in range(3):
                    await call(method, path, body())
                bodies = [body() for _ in range(requests)]
                for each in bodies:
                    await call(method, path, each)

        asyncio.run(run())


def instructions(case: str, requests: int) -> int:
    """Instructions of the whole process of `child(case, requests)`, by callgrind."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        case,
        "--requests",
        str(requests),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    run = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise RuntimeError(f"{case}: callgrind failed:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--requests", type=int, default=500, help="requests per case")
    parser.add_argument("--child", choices=sorted(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.requests)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is needed (apt-get install valgrind)")
    requests = args.requests
    figures: dict[str, int] = {}
    print(f"{'case':<22}{'instructions':>16}")
    for case in CASES:
        # The batch case sends fewer, larger requests: per workload, as many in all.
        count = max(1, requests // 100) if case == "batch_per_workload" else requests
        each = (instructions(case, count) - instructions(case, 0)) / count
        if case == "batch_per_workload":
            each /= BATCH
        figures[case] = round(each)
        print(f"{case:<22}{figures[case]:>16,}", flush=True)
    print("instructions per request (per workload for the batch), every thread counted")
    if args.json:
        print(json.dumps({"instructions": figures}))


if __name__ == "__main__":
    main()
