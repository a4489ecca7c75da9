"""The walls between tasks (docs/security.md), tried as a hostile member would: a real
`corral up` as root, tasks of real Unix accounts (alice, bob), real cgroups and process
namespaces. Each test fails on a corral without them.

The limits are made small so that each attack ends in seconds: `--task-pids 64`,
`--log-cap 1MiB`, and a memory hog asks for 64 MiB.
"""

from __future__ import annotations

import os
import pwd
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from livecorral import (
    Accounts,
    CorralUp,
    open_folder,
    task_commands,
    team_members,
    wait_until,
)

from walls_support import walled

PIDS = 64
CAP = 1 << 20


@dataclass
class Cluster:
    up: CorralUp
    alice: str  # tokens
    bob: str

    def submit(
        self, token: str, name: str, command: list[str], ports: tuple[str, ...] = (), **task: Any
    ) -> Any:
        body = {
            "name": name,
            "project": "team",
            "tasks": [{"gpu": 0, **task}],
            "command": command,
            "grace_period": 2,
            "ports": [{"name": port} for port in ports],
        }
        with httpx.Client(
            base_url=f"{self.up.url}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ) as client:
            response = client.post("/workloads", json=body)
            assert response.status_code == 201, response.text
            return response.json()

    def cancel(self, token: str, name: str) -> None:
        with httpx.Client(
            base_url=f"{self.up.url}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ) as client:
            response = client.post(f"/workloads/{name}/cancel")
            assert response.status_code in (200, 202), response.text


@pytest.fixture(scope="module")
def cluster(unix_accounts: Accounts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """`corral up` as root with 2 virtual GPUs and small limits; a project `team` with two
    members, alice and bob, each running as their own Unix account."""
    up = CorralUp(
        tmp_path_factory.mktemp("walls") / "corral",
        gpus=2,
        args=["--task-pids", str(PIDS), "--log-cap", str(CAP)],
    )
    try:
        up.start()
        assert "task limits: cgroup" in up.log.read_text(), up.log.read_text()
        yield Cluster(up, *team_members(up, unix_accounts))
    finally:
        up.close()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every task's account may write (sticky, like /tmp)."""
    with open_folder("corral-walls-", 0o1777) as folder:
        yield folder


HOG = """
import sys, time
held = []
for step in range(32):  # 320 MiB at most: over its limit, never over the machine
    held.append(b"x" * (10 << 20))
    print("holding", 10 * len(held), "MiB", flush=True)
print("never stopped", flush=True)
"""


def test_a_memory_hog_is_killed_out_of_memory_while_its_neighbour_runs(cluster: Cluster) -> None:
    up = cluster.up
    cluster.submit(cluster.bob, "neighbour", ["sh", "-c", "echo up; exec sleep 300"])
    up.wait_log("neighbour", "up")
    cluster.submit(cluster.alice, "hog", ["python3", "-c", HOG], memory="64MiB")
    ended = up.wait_status("hog", timeout=60)
    assert ended["status"] == "failed", ended
    assert ended["reason"].endswith("out of memory: limit 64 MiB"), ended
    assert "never stopped" not in up.log_text("hog")
    assert up.workload("neighbour")["status"] == "running"
    cluster.cancel(cluster.bob, "neighbour")
    up.wait_status("neighbour", "failed", "succeeded", "cancelled", timeout=30)


FORKER = f"""
import subprocess, time
started, refused = [], 0
for _ in range({4 * PIDS}):
    try:
        started.append(subprocess.Popen(["sleep", "300"]))
    except OSError:
        refused += 1
print("started", len(started), "refused", refused, flush=True)
time.sleep(300)
"""


def test_a_fork_burst_stops_at_the_pids_limit(cluster: Cluster) -> None:
    up = cluster.up
    workload = cluster.submit(cluster.alice, "forker", ["python3", "-c", FORKER])
    log = up.wait_log("forker", "refused", timeout=60)
    started, refused = (int(word) for word in log.split()[1::2][:2])
    assert started < PIDS and refused > 3 * PIDS, log
    # Seen from outside: never more processes than the limit (launcher and init included).
    commands = task_commands(up.workloads_dir).get((workload["name"], 0), [])
    assert 0 < len(commands) <= PIDS, len(commands)
    cluster.cancel(cluster.alice, "forker")
    up.wait_status("forker", "failed", "succeeded", "cancelled", timeout=30)
    wait_until(lambda: not task_commands(up.workloads_dir).get(("forker", 0)), 20, "the end")


# Leaves the task's process group and writes a heartbeat until it is killed (each beat
# renamed into place: a kill between truncating and writing left an empty file).
LEAVER = """
umask 022
beat='n=0; while :; do n=$((n+1)); echo $n > "$0.new"; mv -f "$0.new" "$0"; sleep 0.05; done'
setsid sh -c "$beat" "$1" &
echo "left the group"
exec sleep 300
"""
# Starts on the GPUs the leaver had: is the leaver's heartbeat still beating?
FOLLOWER = """
before=$(cat "$1") && sleep 1 && after=$(cat "$1") && [ -n "$after" ] || exit 3
if [ "$before" = "$after" ]; then echo "alone on my GPUs"; else echo "the leaver runs on"; fi
"""


def test_a_setsid_child_is_gone_after_cancel_and_only_then_are_its_gpus_given_out(
    cluster: Cluster, shared: Path
) -> None:
    up = cluster.up
    beat = str(shared / "heartbeat")
    cluster.submit(cluster.alice, "leaver", ["sh", "-c", LEAVER, "leaver", beat], gpu=2)
    up.wait_log("leaver", "left the group")
    wait_until(lambda: os.path.exists(beat), 10, "the heartbeat")
    cluster.submit(cluster.bob, "follower", ["sh", "-c", FOLLOWER, "follower", beat], gpu=2)
    time.sleep(0.5)
    assert up.workload("follower")["status"] == "pending"  # the GPUs are the leaver's
    cluster.cancel(cluster.alice, "leaver")
    assert up.wait_status("follower", timeout=60)["status"] == "succeeded"
    assert "alone on my GPUs" in up.log_text("follower"), up.log_text("follower")
    assert not task_commands(up.workloads_dir).get(("leaver", 0))


PEEK = """
import os
mine = os.getpid()
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            line = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\\0", b" ")
        except OSError:
            continue
        print("SEEN", entry, line.decode(errors="replace"), flush=True)
print("peek done", flush=True)
"""


def test_a_task_sees_none_of_another_tasks_processes(cluster: Cluster) -> None:
    up = cluster.up
    cluster.submit(cluster.bob, "secretive", ["sh", "-c", "exec sleep 301"])
    wait_until(lambda: task_commands(up.workloads_dir).get(("secretive", 0)), 20, "bob's task")
    cluster.submit(cluster.alice, "peek", ["python3", "-c", PEEK])
    assert up.wait_status("peek", timeout=30)["status"] == "succeeded"
    log = up.log_text("peek")
    assert "peek done" in log, log
    seen = dict(line.split(" ", 2)[1:] for line in log.splitlines() if line.startswith("SEEN"))
    # Its own init (its launcher's copy, process 1) and itself: not bob's task, nor the
    # server, nor any other launcher.
    assert set(seen) == {"1", "2"}, seen
    assert up.directory("peek") in seen["1"] and seen["2"].startswith("python3 -c"), seen
    cluster.cancel(cluster.bob, "secretive")


def test_a_task_printing_without_end_stops_growing_its_log_at_the_cap(cluster: Cluster) -> None:
    up = cluster.up
    command = ["sh", "-c", "while :; do echo 'corral walls: the oldest of this goes'; done"]
    cluster.submit(cluster.alice, "chatty", command, cpu=0.2)
    log = up.data_dir / "logs" / up.directory("chatty") / "task-0.log"
    # Past four caps of output, however slowly the machine runs it.
    wait_until(lambda: log.exists() and log.stat().st_size > 4 * CAP, 60, "4 MiB of output")
    on_disk = log.stat().st_blocks * 512
    assert on_disk <= CAP + (64 << 10), on_disk
    first = up.logs("chatty", offset=0)["text"]
    assert first.startswith("[corral: "), first[:200]
    assert "bytes of older output were dropped" in first.splitlines()[0]
    assert up.logs("chatty", tail=3)["text"].endswith("goes\n")
    cluster.cancel(cluster.alice, "chatty")
    up.wait_status("chatty", "failed", "succeeded", "cancelled", timeout=30)


OPEN = """
import errno, os, sys
print("mine", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        print(os.path.basename(path), "opened", flush=True)
    except OSError as error:
        print(os.path.basename(path), errno.errorcode[error.errno], flush=True)
"""


def test_a_task_can_open_only_its_own_gpus(cluster: Cluster, shared: Path) -> None:
    """With no GPU here, the device files are made: /dev/nvidiaN is the character device
    195:N. Without a driver, opening one that the cgroup lets through says ENXIO; one the
    cgroup denies, EPERM."""
    up = cluster.up
    paths = []
    for minor in (0, 1):
        path = shared / f"nvidia{minor}"
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        path.chmod(0o666)
        paths.append(str(path))
    cluster.submit(cluster.alice, "opener", ["python3", "-c", OPEN, *paths], gpu=1)
    assert up.wait_status("opener", timeout=30)["status"] == "succeeded"
    lines = dict(line.split(" ", 1) for line in up.log_text("opener").splitlines())
    mine = f"nvidia{lines['mine']}"
    other = "nvidia1" if mine == "nvidia0" else "nvidia0"
    assert lines[mine] == "ENXIO" and lines[other] == "EPERM", lines


# An attacker's task: every socket that listens on the node as the account `uid`, found as
# anyone on the node finds it (/proc/net/tcp names the owner), and knocked on.
KNOCK = """
import socket, sys
uid, found = sys.argv[1], 0
for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] != "0A" or fields[7] != uid:  # listening, and the account's
            continue
        address, port = fields[1].split(":")
        raw = bytes.fromhex(address)  # each 32-bit word in the machine's byte order
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        host = socket.inet_ntop(family, raw)
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        for target in {host, "127.0.0.1" if family == socket.AF_INET else "::1"}:
            found += 1
            try:
                socket.create_connection((target, int(port, 16)), timeout=5).close()
                print("open", target, int(port, 16), flush=True)
            except OSError as error:
                print("refused", target, int(port, 16), error, flush=True)
print("knocked", found, flush=True)
"""
SERVE = 'exec /usr/bin/python3 -m http.server --bind "$CORRAL_HOST" "$CORRAL_PORT"'


def knock(cluster: Cluster, token: str, name: str, uid: int) -> list[str]:
    cluster.submit(token, name, ["python3", "-c", KNOCK, str(uid)])
    assert cluster.up.wait_status(name, timeout=60)["status"] == "succeeded"
    lines = cluster.up.log_text(name).splitlines()
    assert lines and lines[-1].startswith("knocked "), lines
    return lines[:-1]


def test_a_tasks_port_answers_its_own_account_and_corral_only(
    cluster: Cluster, unix_accounts: Accounts
) -> None:
    """bob's workspace listens on a port of the node. alice's task finds it in
    /proc/net/tcp and connects: refused, at the address it listens on and at loopback.
    bob's own task gets in, and so do bob and admins through the proxy. (Before, alice got
    in, and with a notebook ran code as bob.)"""
    from corral.agent import portwall

    missing = portwall.available()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must wall ports: {missing}")
        pytest.skip(f"ports cannot be walled here: {missing}")
    up = cluster.up
    assert "the ports a task is given answer only its own account and corral" in (
        up.log.read_text()
    )
    bob = pwd.getpwnam(unix_accounts.bob).pw_uid
    cluster.submit(cluster.bob, "bob-web", ["sh", "-c", SERVE], ports=("main",))
    wait_until(lambda: proxied(up, cluster.bob, "/w/team/bob-web/") == 200, 30, "bob-web to serve")
    tried = knock(cluster, cluster.alice, "alice-knocks", bob)
    assert tried and all(line.startswith("refused") for line in tried), tried
    assert all("Connection refused" in line for line in tried), tried
    own = knock(cluster, cluster.bob, "bob-knocks", bob)
    assert own and all(line.startswith("open") for line in own), own
    assert proxied(up, cluster.bob, "/w/team/bob-web/") == 200
    assert proxied(up, up.token, "/w/team/bob-web/") == 200
    assert len(walled(up.data_dir, up.directory("bob-web"))) == 1
    cluster.cancel(cluster.bob, "bob-web")
    up.wait_status("bob-web", "failed", "succeeded", "cancelled", timeout=30)
    # Its wall goes with its process: the port is walled again only for the next task
    # given it.
    directory = up.directory("bob-web")
    wait_until(lambda: walled(up.data_dir, directory) == [], 30, "bob-web's wall to go")


def proxied(up: CorralUp, token: str, path: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=up.url, headers=headers, trust_env=False) as http:
        return http.get(path, timeout=30).status_code
