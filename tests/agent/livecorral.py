"""A real `corral up` process (server + in-process agent) for the agent tests, and the
helpers that find and kill every task process it started.

Task processes run in their own sessions, so killing the server does not kill them. They
are found by the data directory (the launcher's command line names its exit file under
DATA_DIR/run) and by the workloads directory (every task's environment names its
checkpoints there).

Run as root (CI), the workloads directory is a fresh one under /tmp, since pytest's own
temporary directories are 0700 and tasks that run as other accounts could not reach it,
and the admin's tasks run as root as the tests always did: `--admin-unix-user root`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from walls_support import remove_walls as remove_walls

CORRAL = str(Path(sys.executable).with_name("corral"))
PYTHON = sys.executable
TERMINAL = ("succeeded", "failed")

# A task's command: hold its devices for argv[1] seconds. Whose processes are on the same
# devices meanwhile is seen from outside (`DeviceWatch`): as root, a task sees only its own
# processes.
DEVICE_CHECK = """
import sys, time
print("holding my devices", flush=True)
time.sleep(float(sys.argv[1]))
print("check done", flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def proc_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, Z...), or None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def running(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    state = proc_state(pid)
    return state is not None and state != "Z"


def runs(*argv: str) -> bool:
    """Whether a live process on this machine was started with `argv` (its first words)."""
    wanted = [part.encode() for part in argv]
    for entry in os.listdir("/proc"):
        command = _read(f"/proc/{entry}/cmdline").split(b"\0")
        if entry.isdigit() and command[: len(wanted)] == wanted and running(int(entry)):
            return True
    return False


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def processes_of(*folders: Path) -> list[int]:
    """Live (non-zombie) processes whose command line or environment names one of
    `folders`."""
    markers = [(str(folder).rstrip("/") + "/").encode() for folder in folders]
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        seen = _read(f"/proc/{pid}/cmdline") + b"\0" + _read(f"/proc/{pid}/environ")
        if any(marker in seen for marker in markers) and running(pid):
            found.append(pid)
    return found


def kill_everything_of(*folders: Path) -> list[int]:
    """SIGKILL every process group that holds a live process of `folders` (a launcher
    leads its task's group). Returns the processes that were found, for reporting."""
    mine = os.getpgrp()
    left = processes_of(*folders)
    groups = set()
    for pid in left:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    for group in groups - {mine, 0, 1}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not processes_of(*folders), 15, "task processes to die")
    return left


def task_commands(folder: Path) -> dict[tuple[str, int], list[tuple[int, set[str]]]]:
    """The live processes of tasks whose checkpoints are under `folder` (a workloads
    directory), by (workload, task): each with its devices. Read from outside the tasks,
    which may each have a process namespace of their own."""
    root = str(folder).rstrip("/") + "/"
    found: dict[tuple[str, int], list[tuple[int, set[str]]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not running(int(entry)):
            continue
        items = _read(f"/proc/{entry}/environ").decode(errors="replace").split("\0")
        env = dict(item.split("=", 1) for item in items if "=" in item)
        if not env.get("CORRAL_CHECKPOINT_DIR", "").startswith(root):
            continue
        key = (env.get("CORRAL_WORKLOAD", ""), int(env.get("CORRAL_TASK_INDEX", "0")))
        devices = {d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d}
        found.setdefault(key, []).append((int(entry), devices))
    return found


class DeviceWatch:
    """Which workloads had processes alive on one device at one moment: /proc sampled
    from outside the tasks every 20 ms while the watch is open."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.together: set[frozenset[str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DeviceWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def met(self, first: str, second: str) -> bool:
        """Whether workloads `first` and `second` (names, or PROJECT/NAME keys) ran on a
        device at once (so far)."""
        short = {frozenset(key.rpartition("/")[2] for key in pair) for pair in self.together}
        return frozenset((first, second)) in self.together | short

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            alive = [
                (workload, devices)
                for (workload, _), processes in task_commands(self.folder).items()
                for _, devices in processes
            ]
            for index, (workload, devices) in enumerate(alive):
                for other, theirs in alive[index + 1 :]:
                    if other != workload and devices & theirs:
                        self.together.add(frozenset((workload, other)))


@dataclass(frozen=True)
class Accounts:
    """Real Unix accounts made for the tests: alice (also in `group`) and bob."""

    alice: str
    bob: str
    group: str


@contextlib.contextmanager
def open_folder(prefix: str, mode: int) -> Iterator[Path]:
    """A fresh directory of `mode` under /tmp (pytest's own are 0700, which the accounts
    tasks run as cannot enter), removed after."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(mode)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def team_members(up: CorralUp, accounts: Accounts) -> tuple[str, str]:
    """A project `team` on `up` with two members, and their tokens: `alice` (mapped with
    --unix-user) and bob (a corral user named like his account, so mapped by default)."""
    up.queue("team", 2)
    alice = up.post("/users", {"name": "alice", "project": "team", "unix_user": accounts.alice})
    bob = up.post("/users", {"name": accounts.bob, "project": "team"})
    return alice["token"], bob["token"]


TASK_PID = re.compile(r"task (\d+) pid (\d+)")


@dataclass
class CorralUp:
    """`corral up --virtual-gpus N` on its own port and data directory."""

    data_dir: Path
    gpus: int
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    token: str = ""
    node: str = ""
    starts: int = 0
    workloads_dir: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="corral-workloads-"))
    )
    admin_unix_user: str | None = "root" if os.geteuid() == 0 else None
    # Extra variables for the server's environment (on top of this process's).
    env: dict[str, str] = field(default_factory=dict)
    # Extra options of `corral up`.
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.data_dir / f"corral-up-{self.port}.log"

    def start(self) -> CorralUp:
        """Start (or restart, on the same data directory and port) and wait for /healthz."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            CORRAL,
            "up",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--virtual-gpus",
            str(self.gpus),
            "--workloads-dir",
            str(self.workloads_dir),
        ]
        if self.admin_unix_user is not None:
            args += ["--admin-unix-user", self.admin_unix_user]
        args += self.args
        with open(self.log, "ab") as handle:
            # Its own process group, so that teardown can kill it and nothing else.
            self.process = subprocess.Popen(
                args,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        self.starts += 1
        process = self.process
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"corral up exited: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"corral up did not start: {self.log.read_text()}")
            time.sleep(0.1)
        self.token = (self.data_dir / "admin-token").read_text().strip()
        nodes = self.get("/nodes")
        assert len(nodes) == 1, nodes
        self.node = nodes[0]["name"]
        return self

    def kill9(self) -> None:
        """kill -9 the server (its task processes live on, in their own sessions)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def close(self) -> list[int]:
        """Kill the server and every task process it left; returns the processes left."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        left = kill_everything_of(self.data_dir, self.workloads_dir)
        remove_walls(self.data_dir)
        shutil.rmtree(self.workloads_dir, ignore_errors=True)
        return left

    # -- the API ---------------------------------------------------------------------------

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )

    def get(self, path: str, **params: Any) -> Any:
        with self.client() as client:
            response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        with self.client() as client:
            response = client.post(path, json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def queue(self, name: str, deserved: float, **more: Any) -> Any:
        return self.post("/queues", {"name": name, "deserved": deserved, **more})

    def submit(
        self,
        name: str,
        project: str,
        command: list[str],
        gpu: float = 0,
        replicas: int = 1,
        **more: Any,
    ) -> Any:
        body = {
            "name": name,
            "project": project,
            "tasks": [{"replicas": replicas, "gpu": gpu}],
            "command": command,
            **more,
        }
        return self.post("/workloads", body)

    def workload(self, name: str) -> Any:
        return self.get(f"/workloads/{name}")

    def directory(self, name: str) -> str:
        """The name of the workload's directories (NAME.ID): its logs, run files and own
        directory."""
        found: str = self.workload(name)["directory"]
        return found

    def events(self, name: str, kind: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.get(f"/workloads/{name}/events")
        return [e for e in found if kind is None or e["kind"] == kind]

    def logs(self, name: str, task: int = 0, **params: Any) -> Any:
        return self.get(f"/workloads/{name}/logs", task=task, **params)

    def log_text(self, name: str, task: int = 0) -> str:
        text: str = self.logs(name, task)["text"]
        return text

    def started_pids(self, name: str) -> list[tuple[int, int]]:
        """(task, launcher pid) of every task-started event, in order."""
        pairs = []
        for event in self.events(name, "task-started"):
            match = TASK_PID.search(event["reason"])
            assert match, event
            pairs.append((int(match.group(1)), int(match.group(2))))
        return pairs

    def wait_status(self, name: str, *statuses: str, timeout: float = 30) -> Any:
        wanted = statuses or TERMINAL
        last: dict[str, Any] = {}

        def reached() -> Any:
            nonlocal last
            last = self.workload(name)
            return last if last["status"] in wanted else None

        try:
            return wait_until(reached, timeout, f"{name} to be {'/'.join(wanted)}", 0.2)
        except AssertionError as error:
            raise AssertionError(
                f"{error}; it is {last.get('status')} ({last.get('reason')}); "
                f"events: {self.events(name)}"
            ) from None

    def wait_log(self, name: str, text: str, task: int = 0, timeout: float = 30) -> str:
        return str(
            wait_until(
                lambda: log if text in (log := self.log_text(name, task)) else None,
                timeout,
                f"{text!r} in the log of {name} task {task}",
                0.2,
            )
        )


@dataclass
class Servers:
    """Every `corral up` a test started, so that all are torn down."""

    root: Path
    started: list[CorralUp] = field(default_factory=list)

    def __call__(self, gpus: int, queues: dict[str, float] | None = None) -> CorralUp:
        server = CorralUp(self.root / f"corral-{len(self.started)}", gpus)
        self.started.append(server)
        server.start()
        for name, deserved in (queues or {}).items():
            server.queue(name, deserved)
        return server

    def close(self) -> list[int]:
        left = []
        for server in self.started:
            left.extend(server.close())
        return left
