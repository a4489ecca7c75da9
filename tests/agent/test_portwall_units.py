"""The port wall (corral.agent.portwall) on this machine's own nftables, with real sockets:
processes of other accounts connect from this host, and a second host is a network
namespace joined by a veth pair. Root and nftables are needed, which CI has (it installs
nftables); elsewhere these tests skip without them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator

import pytest

from corral.agent.portwall import PortWall, available
from walls_support import knock

MISSING = available()
if MISSING is not None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must wall ports: {MISSING}", pytrace=False)
    pytest.skip(f"ports cannot be walled here: {MISSING}", allow_module_level=True)

OWNER, OTHER = 54321, 65534  # the task's account, and anyone else's (nobody)


@pytest.fixture
def wall() -> Iterator[PortWall]:
    made = PortWall(f"test{secrets.token_hex(4)}")
    made.prepare()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def listener() -> Iterator[int]:
    """A socket listening on every address of this host (as a task may), by root."""
    with socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True) as server:
        server.listen(16)
        yield server.getsockname()[1]


def test_a_walled_port_answers_its_account_and_root_only(wall: PortWall, listener: int) -> None:
    assert knock("127.0.0.1", listener, OTHER) == "open"  # before: anyone
    wall.wall([listener], OWNER, "job.7.task-0.launch-1")
    for host in ("127.0.0.1", "::1", "127.0.0.9"):
        assert knock(host, listener, OTHER).startswith("refused"), host
        assert "Connection refused" in knock(host, listener, OTHER)
        assert knock(host, listener, OWNER) == "open", host
        assert knock(host, listener, 0) == "open", host
    assert wall.walled("job.7.task-0.launch-1") == [listener]
    # A server on this host's loopback lets in no other account of this host, though
    # their connections come from its address.
    wall.servers(["127.0.0.1", "::1"])
    assert knock("127.0.0.1", listener, OTHER).startswith("refused")
    assert knock("::1", listener, OTHER).startswith("refused")
    assert wall.walled("job.7.task-1.launch-1") == []
    # A restarted agent keeps the walls of the tasks that outlived it.
    PortWall(wall.table.removeprefix("corral_")).prepare()
    assert knock("127.0.0.1", listener, OTHER).startswith("refused")
    # Its task ended: open again, and found walled no more.
    assert wall.open("job.7.task-0.launch-1") == [listener]
    assert knock("127.0.0.1", listener, OTHER) == "open"
    assert wall.walled() == []
    # Given to the next task, of another account: walled for that one alone.
    wall.wall([listener], OTHER, "next.8.task-0.launch-1")
    assert knock("127.0.0.1", listener, OTHER) == "open"
    assert knock("127.0.0.1", listener, OWNER).startswith("refused")


def test_an_agent_that_stops_leaves_its_table_only_while_a_port_is_walled(
    wall: PortWall, listener: int
) -> None:
    wall.wall([listener], OWNER, "job.7.task-0.launch-1")
    wall.close()
    assert knock("127.0.0.1", listener, OTHER).startswith("refused")
    wall.open("job.7.task-0.launch-1")
    wall.close()
    listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True)
    assert wall.table not in listed.stdout


@pytest.fixture
def remote() -> Iterator[tuple[str, str, str]]:
    """A second host: a network namespace with a veth pair to this one. Yields its name,
    this host's address on the link and the other host's."""
    name = f"corral-{secrets.token_hex(3)}"
    mine, theirs = f"cw{secrets.token_hex(3)}", f"cx{secrets.token_hex(3)}"
    octet = 1 + secrets.randbelow(250)
    here, there = f"10.213.{octet}.1", f"10.213.{octet}.2"

    def run(*command: str) -> None:
        subprocess.run(command, check=True, capture_output=True, timeout=30)

    run("ip", "netns", "add", name)
    try:
        run("ip", "link", "add", mine, "type", "veth", "peer", "name", theirs)
        run("ip", "link", "set", theirs, "netns", name)
        run("ip", "addr", "add", f"{here}/24", "dev", mine)
        run("ip", "link", "set", mine, "up")
        run("ip", "netns", "exec", name, "ip", "addr", "add", f"{there}/24", "dev", theirs)
        run("ip", "netns", "exec", name, "ip", "link", "set", theirs, "up")
        run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name, here, there
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            run("ip", "link", "del", mine)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def test_from_another_host_only_the_servers_get_through(
    wall: PortWall, listener: int, remote: tuple[str, str, str]
) -> None:
    """A process on another host (root there: its account is not known here) is refused;
    once that host is the server's, it gets through."""
    netns, here, there = remote
    assert knock(here, listener, netns=netns) == "open"
    wall.wall([listener], OWNER, "job.7.task-0.launch-1")
    assert "Connection refused" in knock(here, listener, netns=netns)
    # Ray may name a host by its IPv4 address written as IPv6.
    wall.servers([f"::ffff:{there}"])
    assert knock(here, listener, netns=netns) == "open"
    wall.servers(["10.213.0.254"])
    assert knock(here, listener, netns=netns).startswith("refused")
