"""A workload's name is unique within its project (a workload is PROJECT/NAME), so that no
answer tells a member what another project named its work: through the API of a real
application on SQLite and PostgreSQL, with members of two projects and an admin."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.model import Queue, Resources, TaskGroup
from corral.model.spec import WorkloadSpec
from corral.server.app import create_app
from corral.store import Store


@dataclass
class Clients:
    alice: TestClient  # a member of team-a
    bob: TestClient  # a member of team-b
    admin: TestClient


@pytest.fixture
def clients(store: Store) -> Iterator[Clients]:
    for project in ("team-a", "team-b"):
        store.create_queue(Queue(project, deserved=Resources(gpu=4)))
    admin = store.ensure_admin()
    assert admin is not None
    _, alice = store.create_user("alice", "member", "team-a")
    _, bob = store.create_user("bob", "member", "team-b")
    app = create_app(store, run_scheduler=False)
    with TestClient(app) as base:
        made = [
            TestClient(app, headers={"Authorization": f"Bearer {token}"})
            for token in (alice, bob, admin)
        ]
        assert base.get("/healthz").status_code == 200
        yield Clients(*made)


def submit(client: TestClient, project: str, name: str, **more: Any) -> Any:
    body = {"name": name, "project": project, "tasks": [{"gpu": 1}], "command": ["true"]}
    return client.post("/api/v1/workloads", json={**body, **more})


def test_two_projects_each_have_a_workload_of_one_name(clients: Clients) -> None:
    mine = submit(clients.alice, "team-a", "train")
    assert mine.status_code == 201, mine.text
    assert (mine.json()["name"], mine.json()["project"]) == ("train", "team-a")
    # bob's name is his project's: no 409 tells him that team-a has a "train".
    theirs = submit(clients.bob, "team-b", "train")
    assert theirs.status_code == 201, theirs.text
    assert mine.json()["id"] != theirs.json()["id"]
    assert mine.json()["directory"] != theirs.json()["directory"]
    # Each member reads their own; another project's is 404 even when named.
    assert clients.alice.get("/api/v1/workloads/train").json()["id"] == mine.json()["id"]
    assert clients.bob.get("/api/v1/workloads/train").json()["id"] == theirs.json()["id"]
    outside = clients.alice.get("/api/v1/workloads/train", params={"project": "team-b"})
    assert outside.status_code == 404, outside.text
    assert outside.json()["detail"] == "workload 'train' not found"
    # The admin reads both: the name alone is ambiguous (409 naming both), the project says.
    both = clients.admin.get("/api/v1/workloads/train")
    assert both.status_code == 409, both.text
    assert "team-a/train" in both.json()["detail"] and "team-b/train" in both.json()["detail"]
    pick = clients.admin.get("/api/v1/workloads/train", params={"project": "team-b"})
    assert pick.json()["id"] == theirs.json()["id"]
    # The same name again in one project is 409, naming that project only.
    again = submit(clients.alice, "team-a", "train")
    assert again.status_code == 409, again.text
    assert again.json()["detail"] == "workload 'train' already exists in team-a"
    # Each is its own: alice's events, suspend and delete touch hers only.
    events = clients.alice.get("/api/v1/workloads/train/events").json()
    assert [e["kind"] for e in events] == ["submitted"] and events[0]["workload"] == "train"
    suspended = clients.admin.post("/api/v1/workloads/train/suspend?project=team-a")
    assert suspended.status_code == 200 and suspended.json()["status"] == "suspended"
    assert clients.bob.get("/api/v1/workloads/train").json()["status"] == "pending"
    assert clients.alice.delete("/api/v1/workloads/train").status_code == 204
    assert clients.bob.get("/api/v1/workloads/train").status_code == 200
    listed = clients.admin.get("/api/v1/workloads").json()
    assert [(w["project"], w["name"]) for w in listed] == [("team-b", "train")]


def test_dependencies_and_arrays_are_of_the_project(clients: Clients) -> None:
    for client, project in ((clients.alice, "team-a"), (clients.bob, "team-b")):
        assert submit(client, project, "prep").status_code == 201
    # NAME is the workload of that name in the waiting workload's project.
    waits = submit(clients.bob, "team-b", "main", after=["prep"])
    assert waits.status_code == 201, waits.text
    assert waits.json()["after"] == ["prep:ok"]
    # Another project's is PROJECT/NAME, and only when its project may be read: else the
    # same answer as for a workload that does not exist.
    across = submit(clients.alice, "team-a", "x", after=["team-b/prep"])
    assert across.status_code == 422, across.text
    assert "no workload 'team-b/prep' to wait for" in across.text
    admins = submit(clients.admin, "team-a", "y", after=["team-b/prep:any"])
    assert admins.status_code == 201, admins.text
    assert admins.json()["after"] == ["team-b/prep:any"]
    # Arrays: one name in two projects; cancelling one cancels its own members only.
    for client, project in ((clients.alice, "team-a"), (clients.bob, "team-b")):
        made = submit(client, project, "sweep", array="0-1")
        assert made.status_code == 201, made.text
        assert made.json()["array"]["name"] == "sweep"
    cancelled = clients.alice.post("/api/v1/workloads/sweep/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert sorted(w["name"] for w in cancelled.json()) == ["sweep-0", "sweep-1"]
    assert {w["project"] for w in cancelled.json()} == {"team-a"}
    bobs = clients.bob.get("/api/v1/workloads", params={"array": "sweep"}).json()
    assert [w["status"] for w in bobs] == ["pending", "pending"]
    assert clients.alice.get("/api/v1/workloads", params={"array": "sweep"}).json()


def test_a_workload_of_before_keeps_its_bare_name_and_holds_it_in_its_project(
    store: Store, clients: Clients
) -> None:
    # Stored under its bare name, as every workload was before names were per project.
    store.submit(WorkloadSpec("old", "team-a", "admin", (TaskGroup(gpu=1),), command=("true",)))
    found = clients.alice.get("/api/v1/workloads/old")
    assert found.status_code == 200 and found.json()["name"] == "old", found.text
    assert clients.alice.get("/api/v1/workloads/old?project=team-a").status_code == 200
    assert clients.bob.get("/api/v1/workloads/old").status_code == 404
    # Its name stays taken in its project, and is free in another.
    taken = submit(clients.alice, "team-a", "old")
    assert taken.status_code == 409, taken.text
    assert submit(clients.bob, "team-b", "old").status_code == 201
    # Its owner's (the admin's), which a member may read but not delete.
    assert clients.alice.delete("/api/v1/workloads/old").status_code == 403
    assert clients.admin.delete("/api/v1/workloads/old?project=team-a").status_code == 204


def test_bad_addresses_are_refused_with_the_field(clients: Clients) -> None:
    made = submit(clients.alice, "team-a", "train")
    assert made.status_code == 201
    long = clients.alice.get("/api/v1/workloads/train", params={"project": "x" * 64})
    assert long.status_code == 422 and "project" in long.text
    assert clients.alice.get("/api/v1/workloads/nothing").status_code == 404
    bad_after = submit(clients.alice, "team-a", "z", after=["a/b/c"])
    assert bad_after.status_code == 422 and "after" in bad_after.text


def test_a_reason_names_another_projects_workload_only_to_who_may_read_it(
    store: Store, clients: Clients
) -> None:
    """A reason names the workloads that took or hold GPUs (`reclaimed for team-b/x`): a
    member of another project reads "a workload of team-b" in its place, as `why` shows
    holders; a label or path with "/" in a reason stays as it is."""
    assert submit(clients.alice, "team-a", "victim").status_code == 201
    assert submit(clients.bob, "team-b", "secret-run").status_code == 201
    cause = "reclaim for team-b/secret-run, team-a/victim, k8s.io/zone"
    store.suspend("team-a/victim", cause)
    seen = clients.alice.get("/api/v1/workloads/victim").json()["reason"]
    assert seen == "suspended by reclaim for a workload of team-b, team-a/victim, k8s.io/zone"
    assert "secret-run" not in clients.alice.get("/api/v1/workloads").text
    events = clients.alice.get("/api/v1/workloads/victim/events").text
    assert "secret-run" not in events and "a workload of team-b" in events
    # Who may read team-b reads the name.
    full = clients.admin.get("/api/v1/workloads/victim").json()["reason"]
    assert full == f"suspended by {cause}"
