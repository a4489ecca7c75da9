"""What the dashboard tests share: a client of a live `corral up`, a browser tab that
records console errors, and the cleanup of every process the server started."""

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
from typing import TYPE_CHECKING, Any

import httpx

from walls_support import remove_walls

if TYPE_CHECKING:
    from playwright.sync_api import Page

CORRAL = str(Path(sys.executable).with_name("corral"))
IN_CI = os.environ.get("CI", "").lower() == "true"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


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
class Corral:
    """A running `corral up` and a client of its API."""

    url: str
    data_dir: Path
    token: str
    process: subprocess.Popen[bytes]
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(path, params=params)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text}"
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.http.post(path, json=body)
        assert response.status_code == 201, f"POST {path}: {response.status_code} {response.text}"
        return response.json()

    def submit(self, name: str, project: str, code: str, gpu: float, **more: Any) -> Any:
        """A workload of one task running `python -c code`."""
        body = {
            "name": name,
            "project": project,
            "tasks": [{"gpu": gpu, **more.pop("task", {})}],
            "command": [sys.executable, "-c", code],
            "grace_period": 0,
            **more,
        }
        return self.post("/workloads", body)

    def wait_status(self, name: str, status: str, timeout: float = 30) -> Any:
        return wait_until(
            lambda: (w := self.get(f"/workloads/{name}"))["status"] == status and w,
            timeout,
            f"{name} to be {status}",
        )


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _processes_of(data_dir: Path) -> list[int]:
    """Live processes whose command line or environment names `data_dir`: the server's task
    launchers and tasks, which run in sessions of their own."""
    marker = (str(data_dir).rstrip("/") + "/").encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if not stat or stat[stat.rindex(b")") + 2 :].startswith(b"Z"):
            continue
        if marker in _read(f"/proc/{entry}/cmdline") or marker in _read(f"/proc/{entry}/environ"):
            found.append(int(entry))
    return found


def kill_all(process: subprocess.Popen[bytes], data_dir: Path) -> None:
    """Kill the server's process group, then every task process group it started, and
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
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not _processes_of(data_dir), 10, "task processes to end")
    remove_walls(data_dir)


@dataclass
class Browsing:
    """A page of the browser, with every console error and uncaught exception it met."""

    page: Page
    base: str
    errors: list[str] = field(default_factory=list)

    def open(self, path: str) -> Page:
        self.page.goto(self.base + path)
        return self.page

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"dashboard-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path
