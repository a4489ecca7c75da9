"""Shared fixtures: a real `corral server` process, on SQLite or on a real PostgreSQL.

`live_server` starts the console script on an ephemeral port with its own data directory
and waits for /healthz; `backend` is parametrised over "sqlite" and "postgresql". Tests
that need PostgreSQL skip when pgserver cannot start one, except under CI=true, where
they fail instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.store import Store

CORRAL = str(Path(sys.executable).with_name("corral"))
# Every server the tests start compares each snapshot it keeps between cycles with a full
# read of the store, and fails the cycle on a difference (corral.server.scheduler).
os.environ.setdefault("CORRAL_VERIFY_SNAPSHOTS", "1")
IN_CI = os.environ.get("CI", "").lower() == "true"


# The backends a module's servers are parametrised by: a module's tests for one backend
# share that backend's server, and may run on another worker than the other backends'.
BACKENDS = frozenset({"sqlite", "postgresql", "agent"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long: a module that takes minutes; it is started before the others"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long modules first (a stable sort keeps each module's order; after pytest's own
    reordering by fixture parameters): run in parallel, they would otherwise be left to
    the end, each on one worker while the others idle."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist hands out one module's tests for one backend at a time (a module
    whose servers are module fixtures starts each once, as `--dist loadfile` would),
    so that the halves of a module run on two backends side by side."""
    from xdist.scheduler import LoadScopeScheduling

    class BackendScopes(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            params = nodeid.rsplit("[", 1)[1].rstrip("]").split("-") if "[" in nodeid else []
            backend = next((param for param in params if param in BACKENDS), None)
            return f"{module}[{backend}]" if backend else module

    # In collection order (long modules first), not xdist's default of the scopes with
    # the most tests first, which hands out the fuzzer's two long tests last.
    config.option.loadscopereorder = False
    return BackendScopes(config, log)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LiveServer:
    """A running `corral server` and what a client needs to talk to it."""

    url: str
    data_dir: Path
    db: str | None
    token: str
    process: subprocess.Popen[bytes]
    log: Path
    extra_args: list[str] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return httpx.Client(base_url=self.api, headers=headers, timeout=30)

    def kill(self) -> None:
        """kill -9: no chance to clean up."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """Stop the server; fail if its scheduler caught a kept snapshot that differed
        from the store, or kept engine state that decided otherwise than a fresh cycle
        (CORRAL_VERIFY_SNAPSHOTS)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.log.exists():
            mismatches = [
                line
                for line in self.log.read_text().splitlines()
                if "kept snapshot" in line or "kept state" in line
            ]
            assert not mismatches, f"{self.log}: " + "\n".join(mismatches[:5])

    def restart(self) -> None:
        """Start the server again on the same port, data directory and database."""
        self.stop()
        started = start_server(self.data_dir, self.db, port=int(self.url.rsplit(":", 1)[1]))
        self.process = started.process
        self.log = started.log


def start_server(data_dir: Path, db: str | None, port: int | None = None) -> LiveServer:
    port = port or free_port()
    log = data_dir / f"server-{port}.log"
    args = [CORRAL, "server", "--data-dir", str(data_dir), "--port", str(port)]
    if db:
        args += ["--db", db]
    with open(log, "ab") as handle:
        process = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"corral server exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"corral server did not start: {log.read_text()}")
        time.sleep(0.1)
    token = (data_dir / "admin-token").read_text().strip()
    return LiveServer(url, data_dir, db, token, process, log)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Callable[[], str]]:
    """A factory of fresh PostgreSQL databases on one real server started by pgserver."""
    try:
        import pgserver
    except ImportError as error:  # pragma: no cover - pgserver is a dev dependency
        if IN_CI:
            raise
        pytest.skip(f"pgserver is not installed: {error}")
    root = tempfile.mkdtemp(prefix="corral-pg-")
    try:
        server = pgserver.get_server(root, cleanup_mode="delete")
    except Exception as error:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL could not start: {error}")
    uri = server.get_uri()
    counter = 0

    def fresh() -> str:
        nonlocal counter
        counter += 1
        name = f"corral_{os.getpid()}_{counter}"
        server.psql(f"CREATE DATABASE {name};")
        return uri.replace("/postgres?", f"/{name}?")

    yield fresh
    server.cleanup()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty, migrated store, in this process, on each backend."""
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres")()
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    else:
        url = f"sqlite:///{tmp_path / 'corral.db'}"
    opened = Store(url)
    yield opened
    opened.close()


@pytest.fixture
def live_server(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[LiveServer]:
    """A real server process with an empty store on the `backend` database."""
    db = request.getfixturevalue("postgres")() if backend == "postgresql" else None
    server = start_server(tmp_path, db)
    yield server
    server.stop()


def json_of(response: httpx.Response) -> Any:
    assert response.headers["content-type"].startswith("application/json"), response.text
    return response.json()
