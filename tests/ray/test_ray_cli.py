"""End to end: the real `ray start` CLI and `corral up --ray`, as a user runs them.

The Ray head is started with its own --temp-dir and ports; teardown kills exactly the
processes whose command line names that directory (never `ray stop`).
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
from livecorral import PYTHON, free_port, kill_everything_of, processes_of, wait_until
from raycorral import RayServer, require_ray

require_ray()

RAY = str(Path(PYTHON).with_name("ray"))


@pytest.fixture
def ray_head() -> Iterator[str]:
    """`ray start --head` on 127.0.0.1 with 2 virtual GPUs; its address."""
    temp = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))  # Ray's socket paths are short
    port = free_port()
    args = [RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port)]
    args += ["--num-cpus", "1", "--temp-dir", str(temp), "--include-dashboard", "false"]
    args += ["--disable-usage-stats", "--resources", json.dumps({"corral_virtual_gpus": 2})]
    args += ["--labels", "corral.io/name=head,corral.io/rack=r1"]
    for option in (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    ):
        args += [option, str(free_port())]
    try:
        # Without this, Ray replaces a loopback node address with the machine's outward
        # one; the head must stay on loopback here (a one-machine Ray allows that).
        env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        started = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        yield f"127.0.0.1:{port}"
    finally:
        # Only the processes of this Ray session: they all name its temp dir.
        for pid in processes_of(temp):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not processes_of(temp), 30, "the Ray processes to end")
        shutil.rmtree(temp, ignore_errors=True)


def test_corral_up_on_a_ray_started_by_the_cli(ray_head: str, tmp_path: Path) -> None:
    up = RayServer(tmp_path, 0, address=ray_head, namespace="corral-e2e", command="up")
    try:
        up.start()
        nodes = wait_until(lambda: up.get("/nodes"), 30, "the head node to join")
        assert [(n["name"], n["gpus"], n["labels"]) for n in nodes] == [("head", 2, {"rack": "r1"})]
        up.queue("team", 2)
        up.submit("hello", "team", [PYTHON, "-c", "print('hello from ray')"], gpu=1)
        done = up.wait_status("hello", timeout=60)
        assert done["status"] == "succeeded", done
        wait_until(lambda: "hello from ray" in up.log_text("hello"), 30, "the log")
    finally:
        if up.process is not None and up.process.poll() is None:
            os.killpg(up.process.pid, signal.SIGKILL)
            up.process.wait(timeout=30)
        kill_everything_of(tmp_path)
