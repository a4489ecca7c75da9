"""Helpers for the CLI tests: `corral` commands run as a user would, each in a process of
its own (forked from one that has imported the CLI: cli_forks).

Each `Cli` has a home directory of its own (so a config file written by `corral login`
stays in the test), and either credentials in CORRAL_SERVER/CORRAL_TOKEN or none, so
that it reads the config file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import cli_forks
import httpx

T = TypeVar("T")
CORRAL = Path(sys.executable).with_name("corral")


@dataclass
class Cli:
    """`corral` for one user: `cli.ok(...)`, `cli.fails(..., code=2)`, `cli.json(...)`."""

    home: Path
    server: str | None = None
    token: str | None = None
    # XDG_CONFIG_HOME; None leaves it unset, so that ~/.config is used.
    config_home: Path | None = None

    def env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("CORRAL_") and key != "XDG_CONFIG_HOME"
        }
        # Wide and colourless, so that table cells are not wrapped or split by escapes.
        env.update(HOME=str(self.home), COLUMNS="200", NO_COLOR="1", TERM="dumb")
        if self.config_home is not None:
            env["XDG_CONFIG_HOME"] = str(self.config_home)
        if self.server is not None:
            env["CORRAL_SERVER"] = self.server
        if self.token is not None:
            env["CORRAL_TOKEN"] = self.token
        return env

    def run(
        self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The command's exit code and output, run by a child forked from a process that
        has imported the CLI (cli_forks)."""
        if cli_forks.ENABLED:
            return cli_forks.forks().run(list(args), self.env() | (env or {}), stdin, 60)
        return subprocess.run(
            [str(CORRAL), *args],
            capture_output=True,
            text=True,
            env=self.env() | (env or {}),
            input=stdin,
            timeout=60,
            check=False,
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        """Stdout of a command that must succeed."""
        done = self.run(*args, stdin=stdin)
        assert done.returncode == 0, f"corral {' '.join(args)}: {done.stderr}{done.stdout}"
        return done.stdout

    def json(self, *args: str) -> Any:
        """The JSON a command prints with --json."""
        return json.loads(self.ok(*args, "--json"))

    def fails(self, *args: str, code: int, stdin: str | None = None) -> str:
        """The one error line of a command that must fail with `code`, and nothing else."""
        done = self.run(*args, stdin=stdin)
        assert done.returncode == code, (
            f"corral {' '.join(args)} exited {done.returncode}, not {code}: "
            f"{done.stderr}{done.stdout}"
        )
        assert "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, f"not one line: {done.stderr}"
        assert done.stdout == "", done.stdout
        return lines[0]


def make(api: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    """Create through the API what a test needs but does not test: quicker than the CLI."""
    response = api.post(path, json=body)
    assert response.status_code == 201, response.text
    return response.json()


def row(output: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is `first_cell`."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│┃").split("│")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{output}")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 15.0) -> T:
    """Call `probe` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)
