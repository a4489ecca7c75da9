"""The walls of `corral exec`, `corral shell` and `corral port-forward`, tried as a hostile
member of the project would, on a real `corral up` run as root with real Unix accounts:

- an exec enters the task's working directory as the task's account, so a working
  directory swapped for a symlink to another account's directory leads nowhere;
- only the workload's owner, the project's project-admins and admins enter a workload
  (exec, shell, port-forward, its URLs): a teammate is refused with 403 and why;
- every session is in the audit log: who, workload, task, command, start, end, exit code;
- an open session ends within 5 s once its token is revoked or expires, or its user is
  taken out of the project or deleted;
- an exec runs inside its task's walls: what it leaves dies with the task before the
  task's GPU is given out, it sees the task's processes only, and its memory counts
  against the task's limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from livecorral import (
    CORRAL,
    Accounts,
    CorralUp,
    open_folder,
    processes_of,
    runs,
    wait_until,
)
from test_walls import FOLLOWER, PEEK
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from session_support import ACCESS_ENDED, ended_after

# A session must end this soon after its user loses the right to it.
ENDS_WITHIN = 5.0
# Serves the workload's directory on its declared port, as its account (the system's
# Python: the test's virtualenv may be where other accounts cannot read it).
SERVE = ["/usr/bin/python3", "-m", "http.server", "--bind", "127.0.0.1"]


@dataclass
class World:
    up: CorralUp
    accounts: Accounts
    tokens: dict[str, str]
    shared: Path  # a directory every account may pass through

    def api(self, who: str) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.up.url}/api/v1",
            headers={"Authorization": f"Bearer {self.tokens[who]}"},
            timeout=30,
            trust_env=False,
        )

    def submit(self, who: str, name: str, command: list[str], **more: Any) -> None:
        body = {"name": name, "project": "team", "tasks": [{"gpu": 0}], "command": command}
        with self.api(who) as api:
            answer = api.post("/workloads", json={**body, **more})
        assert answer.status_code == 201, answer.text
        self.up.wait_status(name, "running")
        # Running, and started on the node: its task takes commands beside it.
        wait_until(
            lambda: run_exec(self, who, name, ["true"]).status != 503, 30, f"{name} to start"
        )

    def cli_env(self, who: str) -> dict[str, str]:
        home = self.shared / f"cli-{who}"
        home.mkdir(exist_ok=True)
        return {
            **os.environ,
            "HOME": str(home),
            "CORRAL_SERVER": self.up.url,
            "CORRAL_TOKEN": self.tokens[who],
        }

    def cli(self, who: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`corral ARGS` as `who`, to its end."""
        return subprocess.run(
            [CORRAL, *args],
            env=self.cli_env(who),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def cli_started(self, who: str, *args: str) -> subprocess.Popen[str]:
        """`corral ARGS` as `who`, left running."""
        return subprocess.Popen(
            [CORRAL, *args],
            env=self.cli_env(who),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture(scope="module")
def world(unix_accounts: Accounts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """`corral up` as root with a project `team`: alice (account alice) and bob (account
    bob) are members; pat is its project-admin (an account of none: an exec runs as the
    task's account, not as its caller's)."""
    shared = Path(tempfile.mkdtemp(prefix="corral-walls-"))
    shared.chmod(0o755)
    up = CorralUp(tmp_path_factory.mktemp("walls") / "corral", gpus=1)
    try:
        up.start()
        up.queue("team", 1)
        tokens = {"admin": up.token}
        for name, account in (("alice", unix_accounts.alice), ("bob", unix_accounts.bob)):
            made = up.post("/users", {"name": name, "project": "team", "unix_user": account})
            tokens[name] = made["token"]
        tokens["pat"] = up.post("/users", {"name": "pat", "project": "team"})["token"]
        with up.client() as admin:
            answer = admin.put("/users/pat/projects/team", json={"role": "project-admin"})
            assert answer.status_code == 200, answer.text
        yield World(up, unix_accounts, tokens, shared)
    finally:
        up.close()
        shutil.rmtree(shared, ignore_errors=True)


@dataclass
class Ran:
    """How an exec went: refused with `status` and `detail`, or run (status 101) with its
    output and exit code."""

    status: int
    detail: str = ""
    out: bytes = b""
    err: bytes = b""
    exit: int | None = None


def exec_url(world: World, name: str, command: list[str], tty: bool = False) -> str:
    query = urlencode({"command": command, "tty": str(tty).lower()}, doseq=True)
    base = world.up.url.replace("http://", "ws://")
    return f"{base}/api/v1/workloads/{quote(name)}/exec?{query}"


def session(world: World, who: str, url: str) -> ClientConnection:
    """An open WebSocket session as `who`; InvalidStatus when it is refused."""
    headers = {"Authorization": f"Bearer {world.tokens[who]}"}
    return connect(url, additional_headers=headers, open_timeout=30, proxy=None)


def run_exec(world: World, who: str, name: str, command: list[str], tty: bool = False) -> Ran:
    """`command` beside the task of `name` as `who`, with no input, to its end."""
    try:
        ws = session(world, who, exec_url(world, name, command, tty))
    except InvalidStatus as refused:
        body = json.loads(refused.response.body or b"{}")
        return Ran(refused.response.status_code, body.get("detail", ""))
    ran = Ran(101)
    with ws:
        if not tty:
            # The command may have ended, and the server closed, already.
            with contextlib.suppress(ConnectionClosed):
                ws.send(json.dumps({"eof": True}))
        try:
            while True:
                message = ws.recv(timeout=30)
                if isinstance(message, str):
                    ran.exit = json.loads(message)["exit"]
                elif message[:1] == b"\x01":
                    ran.out += message[1:]
                else:
                    ran.err += message[1:]
        except ConnectionClosed:
            pass
    return ran


# -- 3. the working directory is entered as the task's account -----------------------------


def test_an_exec_through_a_swapped_symlink_cannot_read_the_target(world: World) -> None:
    """alice's working directory, once her task runs, is swapped (by alice, through exec)
    for a symlink to a directory of bob's below his private home (0700). A directory
    entered as root and then left to alice would let her read what is below it; entered
    as alice, the symlink leads nowhere."""
    accounts = world.accounts
    bob_home = world.shared / "bob-home"
    notes = bob_home / "notes"
    notes.mkdir(parents=True)
    (notes / "secret.txt").write_text("bob-canary\n")
    alice_work = world.shared / "alice-home" / "work"
    alice_work.mkdir(parents=True)
    for path, owner, mode in (
        (notes / "secret.txt", accounts.bob, 0o644),
        (notes, accounts.bob, 0o755),
        (bob_home, accounts.bob, 0o700),
        (alice_work, accounts.alice, 0o755),
        (alice_work.parent, accounts.alice, 0o755),
    ):
        shutil.chown(path, owner, owner)
        path.chmod(mode)
    world.submit("alice", "swapped", ["sleep", "600"], workdir=str(alice_work))
    # Before the swap: alice's exec runs in her directory, and bob's file is out of reach.
    before = run_exec(world, "alice", "swapped", ["/bin/sh", "-c", f"pwd; cat {notes}/secret.txt"])
    assert before.exit == 1 and before.out.decode() == f"{alice_work}\n", before
    assert b"Permission denied" in before.err, before
    # alice swaps her working directory for a symlink to bob's notes.
    swap = f"cd /; mv {alice_work} {alice_work}.old && ln -s {notes} {alice_work}"
    swapped = run_exec(world, "alice", "swapped", ["/bin/sh", "-c", swap])
    assert swapped.exit == 0, swapped
    assert os.path.islink(alice_work)
    for tty in (True, False):  # exec, and a shell's terminal
        read = run_exec(world, "alice", "swapped", ["cat", "secret.txt"], tty=tty)
        assert b"bob-canary" not in read.out, read
        assert read.status == 400, read
        assert f"cannot enter the working directory {str(alice_work)!r}" in read.detail, read
        assert f"as {accounts.alice}: Permission denied" in read.detail, read


# -- 4. only the owner, the project's project-admins and admins enter a workload ------------


@pytest.fixture(scope="module")
def web(world: World) -> str:
    """alice's workspace: serves its own directory (private to her account) on `main`."""
    serve = 'exec /usr/bin/python3 -m http.server --bind "$CORRAL_HOST" "$CORRAL_PORT"'
    world.submit("alice", "alice-web", ["/bin/sh", "-c", serve], ports=[{"name": "main"}])
    wait_until(
        lambda: proxied(world, "alice", "/w/team/alice-web/") == 200, 30, "alice-web to serve"
    )
    return "alice-web"


def proxied(world: World, who: str, path: str) -> int:
    headers = {"Authorization": f"Bearer {world.tokens[who]}"}
    with httpx.Client(base_url=world.up.url, headers=headers, trust_env=False) as http:
        return http.get(path, timeout=30).status_code


def forward_url(world: World, name: str) -> str:
    base = world.up.url.replace("http://", "ws://")
    return f"{base}/api/v1/workloads/{name}/ports/main/forward"


def test_a_teammate_is_refused_at_every_entry_with_why(world: World, web: str) -> None:
    """bob, a member of alice's project, may read her workload but not act as her: exec,
    a terminal, port-forward and the workspace's URLs are 403 with the reason, and run
    nothing. (Before, any member of the project got in, and ran commands as alice.)"""
    marker = world.shared / "bob-was-here"
    why = (
        f"team/{web} is alice's: only alice, the project-admins of team and admins may reach "
        "its tasks (exec, shell, port-forward, its URLs)"
    )
    for tty in (False, True):
        refused = run_exec(world, "bob", web, ["touch", str(marker)], tty=tty)
        assert (refused.status, refused.detail) == (403, why), refused
    with pytest.raises(InvalidStatus) as forward:
        session(world, "bob", forward_url(world, web)).close()
    assert forward.value.response.status_code == 403
    assert why in forward.value.response.body.decode()
    assert proxied(world, "bob", f"/w/team/{web}/") == 403
    for command in (("shell", web), ("exec", web, "--", "touch", str(marker))):
        done = world.cli("bob", *command)
        assert done.returncode == 1 and f"403: {why}" in done.stderr, done
    done = world.cli("bob", "port-forward", web, "0:main")
    assert done.returncode == 1 and f"403: {why}" in done.stderr, done
    assert not marker.exists()
    # He still reads it, as a member of its project does.
    with world.api("bob") as api:
        assert api.get(f"/workloads/{web}").status_code == 200


def test_the_owner_project_admins_and_admins_enter_as_the_owners_account(
    world: World, web: str
) -> None:
    for who in ("alice", "pat", "admin"):
        ran = run_exec(world, who, web, ["id", "-un"])
        assert (ran.exit, ran.out) == (0, f"{world.accounts.alice}\n".encode()), (who, ran)
        assert proxied(world, who, f"/w/team/{web}/") == 200, who
        with session(world, who, forward_url(world, web)) as forward:
            forward.send(b"GET / HTTP/1.0\r\n\r\n")
            assert forward.recv(timeout=30)[:12] == b"HTTP/1.0 200", who


def audit_of(world: World, method: str, workload: str) -> list[dict[str, Any]]:
    """The audit log's sessions of `method` into `workload` (of team, which the log names
    as team/NAME), oldest first."""
    with world.api("admin") as api:
        answer = api.get("/audit", params={"action": method})
    assert answer.status_code == 200, answer.text
    return [r for r in answer.json() if r["workload"] == f"team/{workload}"]


def test_an_owners_exec_is_audited_from_start_to_end(world: World, web: str) -> None:
    """Who, the workload, the task, the command, its start, end and exit code; a refused
    exec too, with its status. (Before, sessions were not in the audit log at all.)"""
    script = "sleep 1; exit 3"
    started = time.time()
    ran = run_exec(world, "alice", web, ["/bin/sh", "-c", script])
    assert ran.exit == 3, ran
    refused = run_exec(world, "bob", web, ["id"])
    assert refused.status == 403, refused
    records = audit_of(world, "EXEC", web)
    [mine] = [r for r in records if r["command"] == ["/bin/sh", "-c", script]]
    assert mine["user"] == "alice" and mine["task"] == 0, mine
    assert (mine["method"], mine["route"]) == ("EXEC", "/api/v1/workloads/{name}/exec"), mine
    assert (mine["status"], mine["exit_code"]) == (101, 3), mine
    assert started <= mine["at"] and mine["at"] + 1 <= mine["ended_at"] <= time.time(), mine
    [theirs] = [r for r in records if r["user"] == "bob" and r["command"] == ["id"]]
    assert (theirs["status"], theirs["ended_at"]) == (403, None), theirs
    # `corral audit` shows it.
    table = world.cli("admin", "audit", "--action", "EXEC", "--user", "alice").stdout
    assert "exit 3" in table and "sleep 1" in table, table


def open_sleeper(world: World, who: str, name: str, marker: str) -> ClientConnection:
    """An exec session of `sleep` that outlives any test unless ended, as `who`, with its
    argument `marker` so that its process can be found."""
    ws = session(world, who, exec_url(world, name, ["sleep", marker]))
    wait_until(lambda: runs("sleep", marker), 30, "the session's sleep to start")
    return ws


def test_a_revoked_token_ends_an_open_session_within_5_s(world: World, web: str) -> None:
    """alice's sessions opened with a token of hers (an exec and a port-forward), then the
    token revoked: both end within 5 s, saying why, and the command is killed. (Before,
    they went on for as long as their client kept them.)"""
    with world.api("admin") as api:
        made = api.post("/users/alice/tokens", json={"name": "laptop"}).json()
    world.tokens["alice-laptop"] = made["token"]
    marker, by_cli = "600.101", "600.103"
    cli = world.cli_started("alice-laptop", "exec", web, "--", "sleep", by_cli)
    with (
        open_sleeper(world, "alice-laptop", web, marker) as ws,
        session(world, "alice-laptop", forward_url(world, web)) as forward,
    ):
        wait_until(lambda: runs("sleep", by_cli), 30, "the CLI's session to start")
        with world.api("admin") as api:
            assert api.delete(f"/tokens/{made['id']}").status_code == 204
        revoked = time.monotonic()
        took, code, reason = ended_after(ws, revoked)
        assert took < ENDS_WITHIN and code == ACCESS_ENDED, (took, code, reason)
        assert reason == "session ended: the token is not valid", reason
        took, code, _ = ended_after(forward, revoked)
        assert took < ENDS_WITHIN and code == ACCESS_ENDED, (took, code)
        # The CLI says why its session ended.
        _, errors = cli.communicate(timeout=ENDS_WITHIN + 10)
        assert "corral: session ended: the token is not valid" in errors, errors
        assert cli.returncode != 0
    killed = "the sessions' commands to be killed"
    wait_until(lambda: not (runs("sleep", marker) or runs("sleep", by_cli)), ENDS_WITHIN, killed)
    [record] = [r for r in audit_of(world, "EXEC", web) if r["command"] == ["sleep", marker]]
    assert record["ended_at"] is not None and record["exit_code"] is None, record


def test_an_expired_token_ends_an_open_session_within_5_s(world: World, web: str) -> None:
    with world.api("admin") as api:
        made = api.post("/users/alice/tokens", json={"expires_in": 4}).json()
    world.tokens["alice-brief"] = made["token"]
    marker = "600.102"
    with open_sleeper(world, "alice-brief", web, marker) as ws:
        took, code, reason = ended_after(ws, time.monotonic())
        assert took < 4 + ENDS_WITHIN and code == ACCESS_ENDED, (took, code, reason)
    wait_until(lambda: not runs("sleep", marker), ENDS_WITHIN, "the session's command to be killed")


@pytest.mark.parametrize("how", ["removed from the project", "deleted"])
def test_a_user_who_loses_access_loses_an_open_session_within_5_s(world: World, how: str) -> None:
    """carl, a member running tasks as bob's account, opens a shell into his own workload;
    he is taken out of the project (or deleted): the session ends within 5 s."""
    carl = f"carl-{how.split()[0]}"
    made = world.up.post(
        "/users", {"name": carl, "project": "team", "unix_user": world.accounts.bob}
    )
    world.tokens[carl] = made["token"]
    world.submit(carl, carl, ["sleep", "600"])
    marker = f"600.{len(how)}"
    with open_sleeper(world, carl, carl, marker) as ws:
        with world.api("admin") as api:
            path = f"/users/{carl}/projects/team" if how.startswith("removed") else f"/users/{carl}"
            assert api.delete(path).status_code == 204
        took, code, reason = ended_after(ws, time.monotonic())
        assert took < ENDS_WITHIN and code == ACCESS_ENDED, (took, code, reason)
        why = f"{carl} is not a member of team" if how.startswith("removed") else "not valid"
        assert why in reason, reason
    wait_until(lambda: not runs("sleep", marker), ENDS_WITHIN, "the session's command to be killed")


def test_a_project_admin_made_a_member_loses_a_session_into_a_teammates_workload(
    world: World, web: str
) -> None:
    made = world.up.post("/users", {"name": "quinn", "project": "team"})
    world.tokens["quinn"] = made["token"]
    with world.api("admin") as api:
        assert api.put("/users/quinn/projects/team", json={"role": "project-admin"}).is_success
    marker = "600.105"
    with open_sleeper(world, "quinn", web, marker) as ws:
        with world.api("admin") as api:
            assert api.put("/users/quinn/projects/team", json={"role": "member"}).is_success
        took, code, reason = ended_after(ws, time.monotonic())
        assert took < ENDS_WITHIN and code == ACCESS_ENDED, (took, code, reason)
        assert reason.startswith(f"session ended: team/{web} is alice's: only alice"), reason
    wait_until(lambda: not runs("sleep", marker), ENDS_WITHIN, "the session's command to be killed")


# -- 5. an exec runs inside its task's walls: its cgroup and its namespaces -----------------


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A directory every task's account may write (sticky, like /tmp)."""
    with open_folder("corral-exec-walls-", 0o1777) as folder:
        yield folder


# Leaves the exec's process group with `setsid`, and its streams (the session ends without
# it), writing a heartbeat into $1/beat until it is killed; $1, a directory of its own, is
# in its arguments, so it is found from outside.
LEAVE = """
umask 022
beat='n=0; while :; do n=$((n+1))
echo $n > "$0/beat.new"; mv -f "$0/beat.new" "$0/beat"; sleep 0.05; done'
setsid sh -c "$beat" "$1" </dev/null >/dev/null 2>&1 &
echo "left the group"
"""


def test_an_execs_setsid_child_dies_with_its_task_before_its_gpu_is_given_out(
    world: World, sticky: Path
) -> None:
    """alice execs into her GPU workload a `setsid` child that writes a heartbeat, and
    cancels the workload; bob's workload, given the GPU only then, sees the heartbeat
    stopped, and the child is gone. (Before, the exec's child was the agent's, outside
    the task's cgroup and namespace: it beat on, with the GPU's CUDA_VISIBLE_DEVICES,
    beside the next tenant.)"""
    leaver = sticky / "leaver"
    leaver.mkdir(mode=0o777)
    leaver.chmod(0o777)
    world.submit("alice", "exec-leaver", ["sleep", "600"], tasks=[{"gpu": 1}])
    leave = ["/bin/sh", "-c", LEAVE, "leave", f"{leaver}/"]
    ran = run_exec(world, "alice", "exec-leaver", leave)
    assert (ran.exit, ran.out) == (0, b"left the group\n"), ran
    wait_until(lambda: processes_of(leaver), 30, "the exec's setsid child")
    # The follower reads the heartbeat: it must have begun (else the follower exits 3).
    wait_until(lambda: (leaver / "beat").exists(), 30, "the exec's heartbeat")
    with world.api("bob") as api:
        body = {"name": "exec-follower", "project": "team", "tasks": [{"gpu": 1}]}
        command = ["/bin/sh", "-c", FOLLOWER, "follower", str(leaver / "beat")]
        answer = api.post("/workloads", json={**body, "command": command, "grace_period": 2})
        assert answer.status_code == 201, answer.text
    time.sleep(0.5)
    assert world.up.workload("exec-follower")["status"] == "pending"  # the GPU is alice's
    with world.api("alice") as api:
        assert api.post("/workloads/exec-leaver/cancel").is_success
    assert world.up.wait_status("exec-follower", timeout=60)["status"] == "succeeded"
    assert "alone on my GPUs" in world.up.log_text("exec-follower")
    assert not processes_of(leaver)


def test_an_exec_sees_its_tasks_processes_only(world: World) -> None:
    """bob runs a workload with a marker in its arguments; alice, in an exec and in a
    shell's terminal into her own workload, lists /proc and runs `ps -e`: she sees her
    task's init, its command and her own process, nothing of bob's. (Before, an exec saw
    every process of the node, and every tenant's command lines.)"""
    marker = "600.4242"
    world.submit("bob", "exec-secretive", ["sleep", marker])
    world.submit("alice", "exec-peeker", ["sleep", "600"])
    assert runs("sleep", marker)  # there to be seen
    peek = run_exec(world, "alice", "exec-peeker", ["python3", "-c", PEEK])
    assert peek.exit == 0 and b"peek done" in peek.out, peek
    lines = peek.out.decode().splitlines()
    seen = dict(line.split(" ", 2)[1:] for line in lines if line.startswith("SEEN"))
    # The task's init (its launcher's copy, process 1), its command, and the exec itself.
    [own] = set(seen) - {"1", "2"}
    assert "corral.agent.launch" in seen["1"] and seen["2"].strip() == "sleep 600", seen
    assert seen[own].startswith("python3 -c"), seen
    listed = run_exec(world, "alice", "exec-peeker", ["ps", "-e", "-o", "pid=,args="], tty=True)
    assert listed.exit == 0, listed
    commands = [line.split(None, 1)[1] for line in listed.out.decode().splitlines()]
    assert len(commands) == 3 and marker not in listed.out.decode(), listed
    assert "corral.agent.launch" in commands[0], commands
    assert commands[1:] == ["sleep 600", "ps -e -o pid=,args="], commands


# Holds ever more memory: 256 MiB at most, over its task's limit, never over the machine.
HOG = """
held = []
for step in range(32):
    held.append(b"x" * (8 << 20))
    print("holding", 8 * len(held), "MiB", flush=True)
print("never stopped", flush=True)
"""


def test_an_execs_memory_hog_is_bound_by_its_tasks_limit(world: World) -> None:
    """alice's workload asks for 64 MiB; an exec into it that holds more is killed by the
    kernel (exit 137) before it holds 64 MiB, while the task's command runs on. (Before,
    the exec counted in no limit of the task's: it held all 256 MiB.)"""
    marker = "600.6464"
    world.submit("alice", "exec-roomy", ["sleep", marker], tasks=[{"gpu": 0, "memory": "64MiB"}])
    hog = run_exec(world, "alice", "exec-roomy", ["python3", "-c", HOG])
    assert hog.exit == 137 and b"never stopped" not in hog.out, hog
    assert b"holding 64 MiB" not in hog.out, hog.out[-200:]
    assert runs("sleep", marker)
    assert world.up.workload("exec-roomy")["status"] == "running"
    assert run_exec(world, "alice", "exec-roomy", ["true"]).exit == 0
