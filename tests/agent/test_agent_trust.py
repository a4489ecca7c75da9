"""Tasks run as their submitter, see none of the server's secrets, and one bad workload is
that workload's failure only: on a real `corral up` run as root, with real Unix accounts.

Attacks tried from a member's task: read the data directory, the database, the admin
token, the logs directory, another user's log and checkpoints, the server's environment
(through its own variables and /proc), and list the directory of every workload.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from livecorral import Accounts, CorralUp, open_folder, team_members, wait_until

SECRET = f"canary-{secrets.token_hex(8)}"

PROBE = """
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
echo "home=$HOME user=$USER logname=$LOGNAME path=$PATH"
echo "secret=${CORRAL_TEST_SECRET:-absent}"
echo "checkpoints=$CORRAL_CHECKPOINT_DIR telemetry=$CORRAL_TELEMETRY_FILE pwd=$(pwd)"
for target in "$@"; do
    if [ -d "$target" ]; then read="ls"; else read="cat"; fi
    if $read "$target" >/dev/null 2>&1; then
        echo "READ $target"
    else
        echo "DENIED $target"
    fi
done
env
mkdir -p "$CORRAL_CHECKPOINT_DIR" && echo mine > "$CORRAL_CHECKPOINT_DIR/state" \
    && cat "$CORRAL_CHECKPOINT_DIR/state" >/dev/null && echo "own checkpoint ok"
echo probe done
"""

BOB = """
mkdir -p "$CORRAL_CHECKPOINT_DIR" && echo bob-private > "$CORRAL_CHECKPOINT_DIR/state"
echo "bob ready as $(id -u)"
exec sleep 300
"""


@dataclass
class Cluster:
    up: CorralUp
    accounts: Accounts
    alice: str  # tokens
    bob: str

    def as_user(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.up.url}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )

    def submit(self, token: str, name: str, command: list[str], **more: Any) -> httpx.Response:
        body = {"name": name, "project": "team", "tasks": [{"gpu": 0}], "command": command}
        with self.as_user(token) as client:
            return client.post("/workloads", json={**body, **more})


@pytest.fixture(scope="module")
def cluster(unix_accounts: Accounts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """`corral up` as root, with a canary in its environment, a project `team`, and two
    members: `alice` (mapped with --unix-user) and bob (a corral user named like his
    account, so mapped by default)."""
    up = CorralUp(
        tmp_path_factory.mktemp("trust") / "corral", gpus=2, env={"CORRAL_TEST_SECRET": SECRET}
    )
    try:
        up.start()
        yield Cluster(up, unix_accounts, *team_members(up, unix_accounts))
    finally:
        up.close()


def test_a_task_runs_as_its_submitter_and_reaches_nothing_of_the_server_or_bob(
    cluster: Cluster,
) -> None:
    up, accounts = cluster.up, cluster.accounts
    response = cluster.submit(cluster.bob, "bob-job", ["sh", "-c", BOB])
    assert response.status_code == 201, response.text
    bob_uid = pwd.getpwnam(accounts.bob).pw_uid
    up.wait_log("bob-job", f"bob ready as {bob_uid}")
    server_pid = up.process.pid if up.process else 0
    bob_job = up.directory("bob-job")
    targets = [
        up.data_dir,
        up.data_dir / "corral.db",
        up.data_dir / "admin-token",
        up.data_dir / "logs",
        up.data_dir / "logs" / bob_job / "task-0.log",
        up.workloads_dir / bob_job,
        up.workloads_dir / bob_job / "checkpoints" / "state",
        up.workloads_dir,
        Path(f"/proc/{server_pid}/environ"),
    ]
    for target in targets:
        assert target.exists(), target  # so that DENIED means denied, not missing
    command = ["sh", "-c", PROBE, "probe", *map(str, targets)]
    response = cluster.submit(cluster.alice, "alice-job", command)
    assert response.status_code == 201, response.text
    assert response.json()["user"] == "alice"
    assert up.wait_status("alice-job")["status"] == "succeeded"
    log = up.log_text("alice-job")
    assert "probe done" in log and "own checkpoint ok" in log, log

    alice = pwd.getpwnam(accounts.alice)
    groups = {int(g) for g in re.search(r"groups=([\d ]+)", log)[1].split()}  # type: ignore[index]
    assert _field(log, "uid") == str(alice.pw_uid), log
    assert _field(log, "gid") == str(alice.pw_gid), log
    assert grp.getgrnam(accounts.group).gr_gid in groups, log  # supplementary groups
    assert 0 not in groups, log
    assert f"user={accounts.alice} logname={accounts.alice}" in log, log
    assert "path=/usr/local/bin:/usr/bin:/bin" in log, log
    for target in targets:
        assert f"DENIED {target}\n" in log, (target, log)
    # Nothing of the server's environment reached it, not even under another name.
    assert "secret=absent" in log and SECRET not in log, log
    assert "PYTEST_CURRENT_TEST" not in log and "VIRTUAL_ENV" not in log, log
    # Its paths are in its own directory, which it owns, and none leads to the data dir.
    own = up.workloads_dir / up.directory("alice-job")
    assert f"checkpoints={own}/checkpoints telemetry={own}/task-0.util pwd={own}\n" in log, log
    assert str(up.data_dir) not in log.split("DENIED")[0], log
    info = os.stat(own)
    assert (info.st_uid, info.st_mode & 0o777) == (alice.pw_uid, 0o700)
    assert os.stat(up.workloads_dir).st_mode & 0o777 == 0o711
    assert os.stat(up.data_dir).st_mode & 0o777 == 0o700
    for private in (up.data_dir / "corral.db", up.data_dir / "admin-token"):
        assert os.stat(private).st_mode & 0o077 == 0, private
    log_file = up.data_dir / "logs" / up.directory("alice-job") / "task-0.log"
    assert os.stat(log_file).st_mode & 0o077 == 0


def test_checkpoints_stay_in_place_across_runs_of_a_workload(cluster: Cluster) -> None:
    script = (
        'mkdir -p "$CORRAL_CHECKPOINT_DIR"; echo "$CORRAL_ATTEMPT" >> "$CORRAL_CHECKPOINT_DIR/r";'
        " exit 3"
    )
    response = cluster.submit(cluster.alice, "alice-retries", ["sh", "-c", script], backoff_limit=1)
    assert response.status_code == 201, response.text
    done = cluster.up.wait_status("alice-retries", timeout=60)
    assert done["status"] == "failed" and done["attempts"] == 2, done
    runs = cluster.up.workloads_dir / cluster.up.directory("alice-retries") / "checkpoints" / "r"
    assert len(runs.read_text().split()) == 2


def test_a_user_without_a_unix_account_is_refused_at_submit(cluster: Cluster) -> None:
    made = cluster.up.post(
        "/users", {"name": "carol", "project": "team", "unix_user": "corral-no-such-account"}
    )
    response = cluster.submit(made["token"], "carol-job", ["true"])
    assert response.status_code == 422, response.text
    message = str(response.json()["detail"])
    assert "'carol'" in message and "corral-no-such-account" in message, message
    with cluster.as_user(made["token"]) as client:
        batch = client.post(
            "/workloads/batch",
            json={"workloads": [{"project": "team", "tasks": [{"gpu": 0}], "command": ["true"]}]},
        )
    assert batch.status_code == 422, batch.text
    assert not [w for w in cluster.up.get("/workloads") if w["user"] == "carol"]


def test_the_admin_without_an_account_is_refused_on_a_root_agent(
    unix_accounts: Accounts, tmp_path: Path
) -> None:
    up = CorralUp(tmp_path / "corral", gpus=1, admin_unix_user=None)
    try:
        up.start()
        up.queue("team", 1)
        with up.client() as client:
            response = client.post(
                "/workloads", json={"project": "team", "tasks": [{"gpu": 0}], "command": ["true"]}
            )
        assert response.status_code == 422, response.text
        assert "user 'admin' has no Unix account" in str(response.json()["detail"])
        assert "as their submitter's Unix account" in up.log.read_text()
        assert "the admin's are refused" in up.log.read_text()
    finally:
        up.close()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every account may enter (pytest's own are 0700)."""
    with open_folder("corral-trust-", 0o755) as folder:
        yield folder


def test_one_bad_workload_fails_alone(cluster: Cluster, open_dir: Path) -> None:
    """Workloads the agent cannot start fail with the reason, within their backoff limit;
    the steady one beside them keeps its process, the node stays ready, the scheduler
    goes on, and DELETE answers 204 for every one of them. (What the submit pre-flight
    can see on this machine is refused before: the test after this one.)"""
    up = cluster.up
    steady = up.submit("steady", "team", ["sleep", "300"], gpu=1)
    assert steady["status"] in ("pending", "running")
    up.wait_status("steady", "running")
    [(_, pid)] = wait_until(lambda: up.started_pids("steady"), 30, "steady to start")
    bad = {
        "no-such-dir": ({"workdir": "/nonexistent/corral"}, "cannot enter the working directory"),
        "no-program": ({"command": ["corral-no-such-program"]}, "No such file or directory"),
    }
    for name, (fields, _) in bad.items():
        command = fields.pop("command", ["true"])
        response = cluster.submit(cluster.alice, name, command, backoff_limit=1, **fields)
        assert response.status_code == 201, response.text
    for name, (_, reason) in bad.items():
        done = up.wait_status(name, timeout=60)
        assert done["status"] == "failed", done
        assert done["attempts"] == 2, done  # the backoff limit applies, as to any failure
        assert reason in (done["reason"] or ""), done
    # The steady workload was not touched, and the node is ready.
    assert up.workload("steady")["status"] == "running"
    assert up.started_pids("steady") == [(0, pid)]
    assert os.path.exists(f"/proc/{pid}")
    [node] = up.get("/nodes")
    assert node["state"] == "ready", node
    # The scheduler goes on: new work still starts.
    up.submit("after", "team", ["true"], gpu=1)
    assert up.wait_status("after")["status"] == "succeeded"
    with up.client() as client:
        for name in [*bad, "steady", "after"]:
            assert client.delete(f"/workloads/{name}").status_code == 204
            assert client.delete(f"/workloads/{name}").status_code == 404


def test_what_the_account_cannot_reach_is_refused_at_submit(
    cluster: Cluster, open_dir: Path
) -> None:
    """A command that works in the submitter's shell (here root's) but not as the task's
    account is refused at submit with the reason and the fix, never started: a program
    behind a private directory (a virtualenv under a 0700 home), a script whose
    interpreter is, a file alice may not execute, a working directory she cannot enter."""
    private = open_dir / "home"
    interpreter = private / "venv" / "bin" / "python"
    interpreter.parent.mkdir(parents=True)
    interpreter.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
    interpreter.chmod(0o755)
    private.chmod(0o700)
    script = open_dir / "train"
    script.write_text(f"#!{interpreter}\necho trained\n")
    script.chmod(0o755)
    not_executable = open_dir / "not-executable"
    not_executable.write_text("#!/bin/sh\necho never\n")
    not_executable.chmod(0o644)
    path = f"{interpreter.parent}:/usr/bin:/bin"
    refused = {
        "in-private": (["python", "-c", "pass"], {"env": {"PATH": path}}, "command", str(private)),
        "interpreter": ([str(script)], {}, "command", f"its interpreter {interpreter}"),
        "not-exec": ([str(not_executable)], {}, "command", "not executable by it"),
        # The data directory exists, but alice may not enter it.
        "closed-dir": (["true"], {"workdir": str(cluster.up.data_dir)}, "workdir", "closed to it"),
    }
    for name, (command, fields, field, reason) in refused.items():
        response = cluster.submit(cluster.alice, name, command, **fields)
        assert response.status_code == 422, (name, response.text)
        message = str(response.json()["detail"])
        assert field in message and reason in message, (name, message)
        assert cluster.accounts.alice in message and "give the account access" in message
    with cluster.as_user(cluster.alice) as client:
        names = {w["name"] for w in client.get("/workloads").json()}
        batch = client.post(
            "/workloads/batch",
            json={
                "workloads": [
                    {"project": "team", "tasks": [{"gpu": 0}], "command": ["true"]},
                    {"project": "team", "tasks": [{"gpu": 0}], "command": [str(script)]},
                ]
            },
        )
        assert batch.status_code == 422, batch.text
        [error] = batch.json()["detail"]
        assert error["loc"] == ["body", "workloads", 1, "command"], error
        # Nothing of a refused request was stored.
        assert {w["name"] for w in client.get("/workloads").json()} == names
    assert not set(refused) & names
    # Opened to her, the same command is accepted and runs from that interpreter.
    private.chmod(0o755)
    response = cluster.submit(cluster.alice, "interpreter-open", [str(script)])
    assert response.status_code == 201, response.text
    assert cluster.up.wait_status("interpreter-open")["status"] == "succeeded"
    assert "trained" in cluster.up.log_text("interpreter-open")


def _field(log: str, name: str) -> str:
    for line in log.splitlines():
        for part in line.split(" "):
            if part.startswith(f"{name}="):
                return part.split("=", 1)[1]
    raise AssertionError(f"{name}= not in {log}")


def test_a_task_cannot_plant_code_in_the_launcher_that_stays_root(
    cluster: Cluster, open_dir: Path
) -> None:
    """The launcher keeps root to write the exit file: neither the task's variables
    (PYTHONPATH, LD_PRELOAD...) nor its working directory may change what it imports."""
    pwned = open_dir / "pwned"
    for module in ("json", "signal", "subprocess", "corral"):
        planted = open_dir / f"{module}.py"
        planted.write_text(f"open({str(pwned)!r}, 'a').write('{module}\\n')\n")
    env = {"PYTHONPATH": str(open_dir), "PYTHONSTARTUP": str(open_dir / "json.py")}
    response = cluster.submit(
        cluster.alice, "alice-plants", ["sh", "-c", "echo ran"], env=env, workdir=str(open_dir)
    )
    assert response.status_code == 201, response.text
    assert cluster.up.wait_status("alice-plants")["status"] == "succeeded"
    assert "ran" in cluster.up.log_text("alice-plants")
    assert not pwned.exists(), pwned.read_text()
