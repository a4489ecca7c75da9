"""The README's first job, run as the README writes it.

`make run` (with a random port, and a fresh home so that the default data directory
`~/.local/share/corral` is new) starts corral; the README's command block then runs line
by line in bash, in the repository, after the README's `. .venv/bin/activate`. Each line
must succeed and the job must end `succeeded`: its command is the virtualenv's `python`,
which only the submitter's environment (sent by `corral submit`) gives the task.

Run as root, corral runs each task as its submitter's account and the admin has none
unless given, as the README says: the server then starts with
`make run ARGS='--admin-unix-user root'`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DEFAULT_PORT = "8700"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def shell_blocks(text: str) -> list[list[str]]:
    """The README's ```sh blocks, as lists of their command lines (comments dropped)."""
    blocks = re.findall(r"^```sh\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    return [
        [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
        for block in blocks
    ]


def block_with(text: str, word: str) -> list[str]:
    """The one command block that holds `word`."""
    found = [block for block in shell_blocks(text) if any(word in line for line in block)]
    assert len(found) == 1, f"README.md: {len(found)} ```sh blocks hold {word!r}"
    return found[0]


@dataclass
class Corral:
    """`make run` in a fresh home, on `port`."""

    home: Path
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "XDG_"))}
        # The README's shell: the user's own, without the test's virtualenv on PATH.
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = os.pathsep.join(
            part for part in env.get("PATH", "").split(os.pathsep) if ".venv" not in part
        )
        env.update(HOME=str(self.home), COLUMNS="200", NO_COLOR="1", TERM="dumb")
        return env

    def token(self) -> str:
        return (self.home / ".local/share/corral/admin-token").read_text().strip()


def make_run_args() -> list[str]:
    return ["ARGS=--admin-unix-user root"] if os.geteuid() == 0 else []


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corral]:
    home = tmp_path_factory.mktemp("readme-home")
    port = free_port()
    log = home / "make-run.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["HOME"] = str(home)
    with open(log, "wb") as handle:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"PORT={port}", *make_run_args()],
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    live = Corral(home, port, process, log)
    try:
        wait_healthy(live)
        yield live
    finally:
        # make and corral up are in a session of their own, led by make.
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_healthy(live: Corral) -> None:
    deadline = time.monotonic() + 120
    while True:
        if live.process.poll() is not None:
            raise RuntimeError(f"make run exited: {live.log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{live.port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"make run did not start: {live.log.read_text()}")
        time.sleep(0.2)


def run_line(live: Corral, line: str) -> subprocess.CompletedProcess[str]:
    """One README line in bash, in the repository, with the virtualenv active as the
    README says; only the port differs from what is written."""
    script = f"set -eo pipefail\n. .venv/bin/activate\n{line.replace(DEFAULT_PORT, str(live.port))}"
    return subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env=live.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_readme_block_runs_as_written(corral: Corral) -> None:
    text = README.read_text()
    assert ". .venv/bin/activate" in block_with(text, "corral demo")
    block = block_with(text, "corral login")
    lines = " ".join(block)
    for command in ("login", "project create", "submit", "list", "describe", "logs", "why"):
        assert f"corral {command}" in lines
    assert "corral queues" in lines and "corral nodes" in lines
    outputs = []
    for line in block:
        done = run_line(corral, line)
        assert done.returncode == 0, f"{line}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        outputs.append(done.stdout)
    headers = {"Authorization": f"Bearer {corral.token()}"}
    workload = httpx.get(
        f"http://127.0.0.1:{corral.port}/api/v1/workloads/train-1", headers=headers
    ).json()
    assert workload["status"] == "succeeded", workload
    # The log shows the example's own lines: it ran in the virtualenv's python.
    assert "starting from scratch" in "".join(outputs)
    # The task ran where it was submitted from, with the submitter's PATH.
    assert workload["workdir"] == str(ROOT)
    assert workload["env"]["PATH"].startswith(str(ROOT / ".venv" / "bin"))


def test_a_second_server_on_a_busy_port_stops_first(corral: Corral, tmp_path: Path) -> None:
    data = tmp_path / "second"
    done = subprocess.run(
        [str(ROOT / ".venv/bin/corral"), "up", "--port", str(corral.port), "--data-dir", str(data)],
        env=corral.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip() == (
        f"port {corral.port} on 127.0.0.1 is already in use (another corral?); "
        "stop it or choose another with --port"
    )
    # No token was made, nor any data directory.
    assert not data.exists()
