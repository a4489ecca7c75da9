"""Fixtures for the CLI tests: one real `corral server`, on SQLite, shared by a module.

Starting a server costs about a second, so the tests of a module share one; each test
makes projects, users and nodes of its own names, and nodes carry a `pool` label of the
test's own, so that its workloads only ever land on its nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from cli_support import Cli

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture(scope="session")
def root_conftest(pytestconfig: pytest.Config) -> ModuleType:
    """tests/conftest.py as pytest loaded it; every conftest is named `conftest`, so it
    cannot be imported by name."""
    for plugin in pytestconfig.pluginmanager.get_plugins():
        path = getattr(plugin, "__file__", None)
        if isinstance(plugin, ModuleType) and path and Path(path).resolve() == ROOT_CONFTEST:
            return plugin
    raise RuntimeError(f"{ROOT_CONFTEST} is not loaded")


@pytest.fixture(scope="module", params=["sqlite"])
def server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    root_conftest: ModuleType,
) -> Iterator[Any]:
    """A real server process (tests/conftest.py's LiveServer) on SQLite. The CLI is a
    client of the API, and what the API answers on PostgreSQL is the server's tests'
    (tests/server, on both databases). Run here on PostgreSQL as well, 18 of the CLI's
    tests took 480 of a full run's 6,000 worker seconds for output that the database
    cannot change."""
    live = root_conftest.start_server(tmp_path_factory.mktemp(f"cli-{request.param}"), None)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def admin(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """The CLI of the server's admin, with credentials from the environment."""
    return Cli(tmp_path_factory.mktemp("admin-home"), server.url, server.token)


@pytest.fixture(scope="module")
def api(server: Any) -> Iterator[httpx.Client]:
    """The API itself, as the admin, to check what the CLI did."""
    with server.client() as client:
        yield client
