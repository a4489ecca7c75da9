"""A workload's past is its own (issue 39), on a real `corral up`: a member's workload
prints its project's secret and checkpoints it; once it is deleted, a member of another
project submits a workload of the same name, whose log, events and own directory hold
nothing of the first one's. Deleting the first one removed its files from the disk."""

from __future__ import annotations

import os
import secrets
import subprocess
from typing import Any

import httpx
from livecorral import CORRAL, CorralUp, Servers, wait_until

SECRET = f"red-secret-{secrets.token_hex(8)}"

FIRST = (
    'echo "token is $TOKEN"; mkdir -p "$CORRAL_CHECKPOINT_DIR";'
    ' echo "$TOKEN" > "$CORRAL_CHECKPOINT_DIR/state"'
)
# The second one shows whatever it finds in its own directory.
SECOND = 'echo "mine"; cat "$CORRAL_CHECKPOINT_DIR/state" 2>&1; ls -a "$(pwd)"; echo done'


def _member(up: CorralUp, name: str, project: str) -> httpx.Client:
    body: dict[str, Any] = {"name": name, "project": project}
    if os.geteuid() == 0:
        # A root agent runs a task as its submitter's Unix account: both as the same one,
        # so that only the names of their directories keep them apart.
        body["unix_user"] = "nobody"
    token = up.post("/users", body)["token"]
    return httpx.Client(
        base_url=f"{up.url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _submit(member: httpx.Client, project: str, script: str, **more: Any) -> dict[str, Any]:
    body = {"name": "shared", "project": project, "tasks": [{"gpu": 0}]}
    response = member.post("/workloads", json={**body, "command": ["sh", "-c", script], **more})
    assert response.status_code == 201, response.text
    found: dict[str, Any] = response.json()
    return found


def test_a_reused_name_in_another_project_sees_none_of_the_first_ones_past(
    corral_up: Servers,
) -> None:
    up = corral_up(1, {"red": 1, "blue": 1})
    with up.client() as admin:
        put = admin.put("/projects/red/secrets/TOKEN", json={"value": SECRET})
        assert put.status_code == 204, put.text
    alice, bob = _member(up, "alice", "red"), _member(up, "bob", "blue")
    first = _submit(alice, "red", FIRST, secrets={"TOKEN": "TOKEN"})
    assert up.wait_status("shared")["status"] == "succeeded"
    assert f"token is {SECRET}" in up.log_text("shared")
    left = [up.data_dir / "logs", up.data_dir / "run", up.workloads_dir]
    assert [path.name for path in left[0].iterdir()] == [first.get("directory", "shared")]
    assert alice.delete("/workloads/shared").status_code == 204

    second = _submit(bob, "blue", SECOND)
    assert up.wait_status("shared")["status"] == "succeeded"
    log = bob.get("/workloads/shared/logs").json()["text"]
    assert log.startswith("mine\n") and "done" in log, log
    assert SECRET not in log and "token is" not in log, log
    env = {**os.environ, "CORRAL_SERVER": up.url}
    env["CORRAL_TOKEN"] = bob.headers["Authorization"].removeprefix("Bearer ")
    shown = subprocess.run(
        [CORRAL, "logs", "shared"], capture_output=True, text=True, env=env, timeout=60
    )
    assert shown.returncode == 0 and shown.stdout.startswith("mine\n"), shown
    assert SECRET not in shown.stdout + shown.stderr
    events = bob.get("/workloads/shared/events").json()
    kinds = [event["kind"] for event in events]
    assert kinds == ["submitted", "bound", "task-started", "task-exited", "succeeded"], events
    # Its own directory, its logs and its events are its own, by its id.
    assert second["id"] > first["id"] and second["directory"] != first["directory"]
    assert second["directory"] == f"blue_shared.{second['id']}"
    # What the first one left on disk went with it.
    gone = [folder / first["directory"] for folder in left]
    wait_until(lambda: not any(path.exists() for path in gone), 10, "the first one's files to go")
