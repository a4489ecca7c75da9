"""Fixtures for the agent tests: real `corral up` processes, killed with every task process
they started at teardown."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import Servers


@pytest.fixture
def corral_up(tmp_path: Path) -> Iterator[Servers]:
    """A factory: `corral_up(gpus, {"project": deserved})` starts `corral up` with that many
    virtual GPUs and creates those queues."""
    servers = Servers(tmp_path)
    yield servers
    left = servers.close()
    if left:
        warnings.warn(f"killed task processes left behind: {left}", stacklevel=1)


@pytest.fixture(scope="module")
def module_corral_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Like `corral_up`, shared by the tests of one module."""
    servers = Servers(tmp_path_factory.mktemp("corral-up"))
    yield servers
    left = servers.close()
    if left:
        warnings.warn(f"killed task processes left behind: {left}", stacklevel=1)
