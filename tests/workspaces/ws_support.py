"""What the workspace tests share: a live `corral up`, users of its projects, the CLI as
each of them, and cleanup of every process the server started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from walls_support import remove_walls

CORRAL = str(Path(sys.executable).with_name("corral"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


@dataclass
class Server:
    """A running `corral up`, its admin token, and the tokens of its test users."""

    url: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    tokens: dict[str, str] = field(default_factory=dict)

    def api(self, who: str = "admin") -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {self.tokens[who]}"},
            timeout=30,
            trust_env=False,
        )

    def http(self, who: str | None = "admin") -> httpx.Client:
        """A client of the server's root (the proxy), as `who` (None: nobody)."""
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, trust_env=False)

    def cli_env(self, who: str = "admin") -> dict[str, str]:
        home = self.data_dir.parent / f"home-{who}"
        home.mkdir(exist_ok=True)
        return {
            **os.environ,
            "HOME": str(home),
            "CORRAL_SERVER": self.url,
            "CORRAL_TOKEN": self.tokens[who],
        }

    def ws_url(self, path: str) -> str:
        return self.url.replace("http://", "ws://") + path

    def cli(
        self, *args: str, who: str = "admin", timeout: float = 180, stdin: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """Run `corral ARGS` as `who`; its exit code, stdout and stderr."""
        return subprocess.run(
            [CORRAL, *args],
            env=self.cli_env(who),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
        )

    def workload(self, name: str) -> dict[str, Any]:
        with self.api() as api:
            answer = api.get(f"/workloads/{name}")
            assert answer.status_code == 200, answer.text
            found: dict[str, Any] = answer.json()
            return found

    def wait_status(self, name: str, status: str, timeout: float = 60) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            found.update(self.workload(name))
            return found if found["status"] == status else None

        try:
            result: dict[str, Any] = wait_until(reached, timeout, f"{name} to be {status}")
        except AssertionError as error:
            raise AssertionError(f"{error}; it is {found.get('status')}: {found}") from None
        return result


def start_server(data_dir: Path, *extra: str) -> Server:
    """`corral up --virtual-gpus 2 EXTRA...` on a free port with its own data directory."""
    port = free_port()
    log = data_dir.parent / f"{data_dir.name}-up.log"
    as_root = ["--admin-unix-user", "root"] if os.geteuid() == 0 else []
    more = ["--port", str(port), *as_root, *extra]
    with open(log, "wb") as handle:
        # A session of its own, so that teardown kills its group and nothing else.
        process = subprocess.Popen(
            [CORRAL, "up", "--virtual-gpus", "2", "--data-dir", str(data_dir), *more],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"corral up exited: {log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/healthz", timeout=1, trust_env=False).status_code == 200
        return False

    try:
        wait_until(healthy, 60, "corral up to answer /healthz")
    except BaseException:
        stop_server(process, data_dir)
        raise
    server = Server(url, data_dir, process)
    server.tokens["admin"] = (data_dir / "admin-token").read_text().strip()
    return server


def _processes_of(data_dir: Path) -> list[int]:
    """Live processes whose command line or environment names `data_dir`."""
    marker = (str(data_dir).rstrip("/") + "/").encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            if stat[stat.rindex(b")") + 2 :].startswith(b"Z"):
                continue
            text = Path(f"/proc/{entry}/cmdline").read_bytes()
            text += Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker in text:
            found.append(int(entry))
    return found


def stop_server(process: subprocess.Popen[bytes], data_dir: Path) -> None:
    """Kill the server's process group, then the task process groups it started, and
    remove the walls its agent left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    mine = os.getpgrp()
    for pid in _processes_of(data_dir):
        with contextlib.suppress(OSError):
            group = os.getpgid(pid)
            if group not in (mine, 0, 1):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    remove_walls(data_dir)
