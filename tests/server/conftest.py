"""Fixtures for the server's tests: one real server per backend shared by a module.

Starting a server takes about a second, so tests that can live beside others (they make
their own queues, and nodes in a pool of their own) share `api`; tests that need the
whole store to themselves use `live_server` from tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from server_support import Api

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture(scope="session")
def root_conftest(pytestconfig: pytest.Config) -> ModuleType:
    """tests/conftest.py as pytest loaded it (every conftest here is named `conftest`,
    so it cannot be imported by name)."""
    for plugin in pytestconfig.pluginmanager.get_plugins():
        file = getattr(plugin, "__file__", None)
        if isinstance(plugin, ModuleType) and file and Path(file).resolve() == ROOT_CONFTEST:
            return plugin
    raise RuntimeError(f"{ROOT_CONFTEST} is not loaded")


@pytest.fixture(scope="session")
def start_server(root_conftest: ModuleType) -> Callable[..., Any]:
    """`start_server(data_dir, db, port=None)` of tests/conftest.py."""
    function: Callable[..., Any] = root_conftest.start_server
    return function


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    start_server: Callable[..., Any],
) -> Iterator[Any]:
    """A real server process on the parametrised backend, shared by one test module."""
    db = request.getfixturevalue("postgres")() if request.param == "postgresql" else None
    server = start_server(tmp_path_factory.mktemp(f"server-{request.param}"), db)
    yield server
    server.stop()


@pytest.fixture
def api(shared_server: Any) -> Iterator[Api]:
    """The shared server, seen by its admin."""
    helper = Api(shared_server)
    yield helper
    helper.close()
