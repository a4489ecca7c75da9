"""The wall around the ports corral gives a task (a workspace's `main`, `--port NAME`):
only the task's own account, root (the agent, the server's proxy and `corral
port-forward`) and the server's hosts may connect to them. Every other process of the
node, of any account, is answered with a reset, as if nothing listened there.

It is built with nftables (the `nft` command, run as root): one table per agent,

    table inet corral_AGENT
      map walled: port -> jump pPORT    the ports of live tasks
      set servers4, servers6            the server's addresses (Ray: its host)
      chain output  (hook output)       to a local address: a walled port's chain
      chain input   (hook input)        from another host: a walled port's chain
      chain pPORT                       owner uids and (from other hosts) the servers
                                        return; the rest is rejected

A connection made on the node goes through `output`, where the kernel knows the account
of the socket (`meta skuid`); one from another host through `input`, where only its
address is known. The table outlives the agent, as its tasks do: a restarted agent keeps
their walls and clears a task's when it ends. A port's chain is emptied (opened), never
removed, so that the map never points at nothing; it is filled again when the port is
given to the next task.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("corral.agent")

# How long one `nft` run may take (a transaction of a few rules takes milliseconds).
NFT_TIMEOUT = 10.0
# The longest comment nftables keeps on a rule.
MAX_COMMENT = 127


class PortWallError(RuntimeError):
    """nft refused: the message says what it printed."""


def available() -> str | None:
    """None when this agent can wall ports; else why not."""
    if os.geteuid() != 0:
        return "corral does not run as root"
    if _command() is None:
        return "the nft command is missing (Debian and Ubuntu: apt-get install nftables)"
    try:
        _nft(["list", "tables"])
    except PortWallError as error:
        return f"nftables refused: {error}"
    return None


class PortWall:
    """One agent's table of walled ports."""

    def __init__(self, key: str) -> None:
        self.table = f"corral_{key}"
        self._servers: tuple[str, ...] | None = None

    def prepare(self) -> None:
        """Make the table, its sets and its two hooks; the walls of tasks that outlived a
        previous agent are kept."""
        t = f"inet {self.table}"
        _script(
            [
                f"add table {t}",
                f"add map {t} walled {{ type inet_service : verdict; }}",
                f"add set {t} servers4 {{ type ipv4_addr; }}",
                f"add set {t} servers6 {{ type ipv6_addr; }}",
                f"add chain {t} output {{ type filter hook output priority filter; }}",
                f"flush chain {t} output",
                f"add rule {t} output fib daddr type local tcp dport vmap @walled",
                f"add chain {t} input {{ type filter hook input priority filter; }}",
                f"flush chain {t} input",
                f"add rule {t} input fib saddr type != local tcp dport vmap @walled",
            ]
        )

    def wall(self, ports: Iterable[int], uid: int, label: str) -> None:
        """Let only `uid`, root, this agent's account and the servers connect to `ports`;
        `label` names the task, to find its ports again (`open`)."""
        t = f"inet {self.table}"
        uids = ", ".join(str(u) for u in sorted({0, os.geteuid(), uid}))
        comment = json.dumps(label[:MAX_COMMENT])
        lines = []
        for port in ports:
            chain = f"{t} p{int(port)}"
            lines += [
                f"add chain {chain}",
                f"flush chain {chain}",
                f"add rule {chain} meta skuid {{ {uids} }} return comment {comment}",
                # From other hosts only: a process here connects from a server address
                # too (127.0.0.1, when the server is on loopback), as any account.
                f"add rule {chain} fib saddr type != local ip saddr @servers4 return",
                f"add rule {chain} fib saddr type != local ip6 saddr @servers6 return",
                f"add rule {chain} reject with tcp reset",
                f"add element {t} walled {{ {int(port)} : jump p{int(port)} }}",
            ]
        if lines:
            _script(lines)

    def open(self, label: str) -> list[int]:
        """Open the ports walled for `label` (its task has ended); the ports opened."""
        found = self.walled(label)
        if found:
            _script([f"flush chain inet {self.table} p{port}" for port in found])
        return found

    def walled(self, label: str | None = None) -> list[int]:
        """The ports walled for `label` (None: for any task)."""
        listing = json.loads(_nft(["-j", "list", "table", "inet", self.table]) or "{}")
        found = []
        for item in listing.get("nftables", []):
            rule = item.get("rule")
            if rule is None or rule.get("comment") is None:
                continue
            if label is None or rule["comment"] == label[:MAX_COMMENT]:
                chain = str(rule.get("chain", ""))
                if chain.startswith("p") and chain[1:].isdigit():
                    found.append(int(chain[1:]))
        return sorted(set(found))

    def close(self) -> None:
        """The agent stops: its table goes if no task's port is walled in it (tasks that
        outlive the agent keep theirs, for the next agent)."""
        if not self.walled():
            self.remove()

    def servers(self, addresses: Iterable[str]) -> None:
        """The addresses of the server's hosts: they reach walled ports from elsewhere."""
        wanted = tuple(sorted(set(addresses)))
        if wanted == self._servers:
            return
        parsed = [_plain(ipaddress.ip_address(a.strip("[]"))) for a in wanted]
        t = f"inet {self.table}"
        lines = [f"flush set {t} servers4", f"flush set {t} servers6"]
        for version, name in ((4, "servers4"), (6, "servers6")):
            chosen = [str(a) for a in parsed if a.version == version]
            if chosen:
                lines.append(f"add element {t} {name} {{ {', '.join(chosen)} }}")
        _script(lines)
        self._servers = wanted

    def remove(self) -> None:
        """Remove the table and every wall in it."""
        _script([f"add table inet {self.table}", f"delete table inet {self.table}"])


def _plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Any:
    """An IPv4 address written as IPv6 (`::ffff:10.0.0.1`, as Ray may name a host) as the
    IPv4 address its connections come from."""
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def _script(lines: list[str]) -> None:
    """Run `lines` as one nftables transaction: all of them or none."""
    _nft(["-f", "-"], "\n".join(lines) + "\n")


def _command() -> str | None:
    """Where nft is: on the PATH, or where distributions put it (a PATH without the sbin
    directories is common for services)."""
    found = shutil.which("nft")
    if found is None:
        found = next((p for p in ("/usr/sbin/nft", "/sbin/nft") if os.access(p, os.X_OK)), None)
    return found


def _nft(arguments: list[str], script: str | None = None) -> str:
    try:
        done = subprocess.run(
            [_command() or "nft", *arguments],
            input=script,
            capture_output=True,
            text=True,
            timeout=NFT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PortWallError(str(error)) from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[:500] or f"exit code {done.returncode}"
        raise PortWallError(said)
    return done.stdout
