"""Fixtures for the agent tests: real `corral up` processes, killed with every task process
they started at teardown."""

from __future__ import annotations

import os
import secrets
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import Accounts, Servers


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


@pytest.fixture(scope="session")
def unix_accounts() -> Iterator[Accounts]:
    """Two fresh Unix accounts with unique names, removed at the end. Creating them needs
    root, which CI has: only outside CI does a test without root skip."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root, and these tests need real Unix accounts")
        pytest.skip("making Unix accounts needs root")
    stem = f"ct{secrets.token_hex(3)}"
    made = Accounts(f"{stem}-alice", f"{stem}-bob", f"{stem}-grp")

    def run(*command: str) -> None:
        subprocess.run(command, check=True, capture_output=True)

    run("groupadd", made.group)
    try:
        for name, groups in ((made.alice, [made.group]), (made.bob, [])):
            extra = ["--groups", ",".join(groups)] if groups else []
            run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", *extra, name)
        yield made
    finally:
        for name in (made.alice, made.bob):
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", made.group], capture_output=True)
