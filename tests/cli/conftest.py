"""Fixtures for the CLI tests: one real `corral server` per backend, shared by a module.

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


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    root_conftest: ModuleType,
) -> Iterator[Any]:
    """A real server process (tests/conftest.py's LiveServer) on the backend. Tests whose
    outcome cannot depend on the database run on SQLite alone, by `sqlite_only`."""
    db = request.getfixturevalue("postgres")() if request.param == "postgresql" else None
    live = root_conftest.start_server(tmp_path_factory.mktemp(f"cli-{request.param}"), db)
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
