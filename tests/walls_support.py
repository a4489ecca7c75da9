"""The walls a test's agent leaves behind when the test kills it (kill -9, as a crash
would): its task cgroups and its port wall (docs/security.md)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# A Python that every account may run (a venv's may be under root's home).
PYTHON_FOR_ALL = "/usr/bin/python3"
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    print("open")
except OSError as error:
    print("refused", error)
"""


def knock(host: str, port: int, user: int | str = 0, netns: str | None = None) -> str:
    """Connect to host:port as the account `user` (from the network namespace `netns`: a
    host of its own): "open", or "refused" and why."""
    python = PYTHON_FOR_ALL if user not in (0, "root") else sys.executable
    command = [python, "-c", CONNECT, host, str(port)]
    if netns is not None:
        command = ["ip", "netns", "exec", netns, *command]
    done = subprocess.run(command, user=user, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def remove_walls(data_dir: Path) -> None:
    """Kill what is left in the task cgroups of the agent of `data_dir`, and remove them
    and its port wall: a test that kills its agent leaves them behind."""
    from corral.agent import cgroups, portwall

    if os.geteuid() != 0:
        return
    key = cgroups.agent_key(data_dir)
    if portwall.available() is None:
        with contextlib.suppress(portwall.PortWallError):
            portwall.PortWall(key).remove()
    found = cgroups.find(key)
    if isinstance(found, str):
        return
    for task in found.tasks():
        deadline = time.monotonic() + 10
        while not cgroups.cleared(task) and time.monotonic() < deadline:
            time.sleep(0.1)
    for path in set(found.parents.values()):
        with contextlib.suppress(OSError):
            path.rmdir()


def nft_table(data_dir: Path) -> list[dict[str, Any]]:
    """The port wall of the agent of `data_dir` as nftables holds it (`nft -j`)."""
    from corral.agent import cgroups
    from corral.agent.portwall import PortWall

    table = PortWall(cgroups.agent_key(data_dir)).table
    command = ["nft", "-j", "list", "table", "inet", table]
    listed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    items: list[dict[str, Any]] = json.loads(listed)["nftables"]
    return items


def walled(data_dir: Path, directory: str) -> list[int]:
    """The ports that the agent of `data_dir` walls for the workload whose directories
    are named `directory` (NAME.ID)."""
    return sorted(
        int(item["rule"]["chain"][1:])
        for item in nft_table(data_dir)
        if "rule" in item and str(item["rule"].get("comment", "")).startswith(f"{directory}.")
    )
