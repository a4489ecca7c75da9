"""How many worker threads the server runs blocking handlers in (CORRAL_WORKER_THREADS),
and that a bad setting stops it before it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from anyio import to_thread
from fastapi.testclient import TestClient

from corral.api.threads import WORKER_THREADS, worker_threads
from corral.server.app import create_app
from corral.store import Store

CORRAL = str(Path(sys.executable).with_name("corral"))
BAD = ["0", "-2", "four", "2.5", "1e3"]


async def running_at_once() -> float:
    return to_thread.current_default_thread_limiter().total_tokens


@pytest.mark.parametrize(("setting", "threads"), [(None, WORKER_THREADS), ("9", 9), (" 2 ", 2)])
def test_the_server_runs_as_many_worker_threads_at_once_as_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None, threads: int
) -> None:
    if setting is None:
        monkeypatch.delenv("CORRAL_WORKER_THREADS", raising=False)
    else:
        monkeypatch.setenv("CORRAL_WORKER_THREADS", setting)
    store = Store(f"sqlite:///{tmp_path / 'corral.db'}")
    try:
        with TestClient(create_app(store, run_scheduler=False)) as client:
            assert client.portal is not None
            assert client.portal.call(running_at_once) == threads
    finally:
        store.close()


@pytest.mark.parametrize("setting", BAD)
def test_a_bad_worker_threads_setting_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    monkeypatch.setenv("CORRAL_WORKER_THREADS", setting)
    expected = f"CORRAL_WORKER_THREADS must be a whole number of at least 1, not '{setting}'"
    with pytest.raises(ValueError, match=expected):
        worker_threads()


@pytest.mark.parametrize("command", ["server", "up", "demo"])
def test_a_command_that_starts_a_server_refuses_a_bad_worker_threads_setting(
    tmp_path: Path, command: str
) -> None:
    data = tmp_path / "data"
    where = [] if command == "demo" else ["--data-dir", str(data), "--port", "0"]
    done = subprocess.run(
        [CORRAL, command, *where],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CORRAL_WORKER_THREADS": "0"},
    )
    assert done.returncode == 2, done.stderr
    assert "CORRAL_WORKER_THREADS must be a whole number of at least 1, not '0'" in done.stderr
    assert not data.exists()
