"""Who may do what: members in their own projects, viewers read-only, admins everything else;
and the first admin token, which only the owner of the data directory can read."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from server_support import Api, unique


@dataclass
class Team:
    """Two projects, a member of each, a viewer, and a workload in each project."""

    api: Api
    ours: str
    theirs: str
    pool: str
    member: httpx.Client
    other_member: httpx.Client
    viewer: httpx.Client
    our_work: str
    their_work: str


def _user(api: Api, role: str, project: str | None = None) -> httpx.Client:
    body: dict[str, Any] = {"name": unique(role), "role": role}
    if project:
        body["project"] = project
    response = api.admin.post("/users", json=body)
    assert response.status_code == 201, response.text
    return api.client(response.json()["token"])


@pytest.fixture
def team(api: Api) -> Iterator[Team]:
    ours, theirs = api.queue("ours")["name"], api.queue("theirs")["name"]
    pool = unique("pool")
    team = Team(
        api=api,
        ours=ours,
        theirs=theirs,
        pool=pool,
        member=_user(api, "member", ours),
        other_member=_user(api, "member", theirs),
        viewer=_user(api, "viewer"),
        our_work=api.submit(ours, pool)["name"],
        their_work=api.submit(theirs, pool)["name"],
    )
    yield team
    for client in (team.member, team.other_member, team.viewer):
        client.close()


def _body(team: Team, project: str) -> dict[str, Any]:
    return {"project": project, "tasks": [{"gpu": 1}], "node_selector": {"pool": team.pool}}


def test_member_cannot_touch_another_project(team: Team) -> None:
    name = unique("intruder")
    response = team.member.post("/workloads", json={**_body(team, team.theirs), "name": name})
    assert response.status_code == 403, response.text
    assert team.theirs in response.json()["detail"]
    assert team.api.admin.get(f"/workloads/{name}").status_code == 404

    # A batch with one workload of another project stores none of them.
    mine, intruder = unique("mine"), unique("intruder")
    batch = [
        {**_body(team, team.ours), "name": mine},
        {**_body(team, team.theirs), "name": intruder},
    ]
    response = team.member.post("/workloads/batch", json={"workloads": batch})
    assert response.status_code == 403, response.text
    for name in (mine, intruder):
        assert team.api.admin.get(f"/workloads/{name}").status_code == 404

    for method, path in (
        ("DELETE", f"/workloads/{team.their_work}"),
        ("POST", f"/workloads/{team.their_work}/suspend"),
        ("POST", f"/workloads/{team.their_work}/resume"),
    ):
        # 404, as for a workload that does not exist: another project's names do not leak.
        response = team.member.request(method, path)
        assert response.status_code == 404, (method, path, response.text)
    their_work = team.api.workload(team.their_work)
    assert their_work["status"] == "pending"
    events = team.api.admin.get(f"/workloads/{team.their_work}/events").json()
    assert [event["kind"] for event in events] == ["submitted"]


def test_member_manages_its_own_project(team: Team) -> None:
    response = team.member.post("/workloads", json=_body(team, team.ours))
    assert response.status_code == 201, response.text
    mine = response.json()
    assert mine["project"] == team.ours and mine["user"] != "admin"

    response = team.member.post(f"/workloads/{mine['name']}/suspend")
    assert response.status_code == 200 and response.json()["status"] == "suspended"
    response = team.member.post(f"/workloads/{mine['name']}/resume")
    assert response.status_code == 200, response.text
    # What another user submitted in the project is the project-admins' to manage.
    response = team.member.post(f"/workloads/{team.our_work}/suspend")
    assert response.status_code == 403, response.text
    assert team.member.delete(f"/workloads/{team.our_work}").status_code == 403
    assert team.member.delete(f"/workloads/{mine['name']}").status_code == 204
    assert team.api.admin.get(f"/workloads/{mine['name']}").status_code == 404
    assert team.api.workload(team.our_work)["status"] == "pending"
    # Members read their own projects only.
    names = {workload["name"] for workload in team.member.get("/workloads").json()}
    assert team.our_work in names and team.their_work not in names


def test_viewer_reads_but_cannot_write(team: Team) -> None:
    api, viewer = team.api, team.viewer
    queue = api.queue("ro")["name"]
    node = api.node(team.pool, gpus=1)["name"]
    project = team.ours
    writes: list[tuple[str, str, Any]] = [
        ("POST", "/workloads", _body(team, project)),
        ("DELETE", f"/workloads/{team.our_work}", None),
        ("POST", f"/workloads/{team.our_work}/suspend", None),
        ("POST", f"/workloads/{team.our_work}/resume", None),
        ("POST", "/queues", {"name": unique("q")}),
        ("PATCH", f"/queues/{queue}", {"priority": 1}),
        ("DELETE", f"/queues/{queue}", None),
        ("POST", "/nodes", {"name": unique("n"), "gpus": 1}),
        ("POST", f"/nodes/{node}/cordon", None),
        ("POST", f"/nodes/{node}/uncordon", None),
        ("DELETE", f"/nodes/{node}", None),
        ("POST", "/users", {"name": unique("u"), "role": "admin"}),
        ("POST", "/users/admin/tokens", None),
        ("GET", "/users", None),
    ]
    for method, path, body in writes:
        response = viewer.request(method, path, json=body)
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["detail"]

    # Nothing changed.
    assert api.admin.get(f"/queues/{queue}").json()["priority"] == 100
    assert api.admin.get(f"/nodes/{node}").json()["schedulable"] is True
    assert api.workload(team.our_work)["status"] in ("pending", "running")
    assert len(api.admin.get("/workloads", params={"project": project}).json()) == 1

    for path in (
        "/queues",
        f"/queues/{queue}",
        "/workloads",
        f"/workloads/{team.our_work}",
        f"/workloads/{team.our_work}/events",
        f"/workloads/{team.our_work}/why",
        "/nodes",
        f"/nodes/{node}",
        "/cluster",
        "/whoami",
    ):
        response = viewer.get(path)
        assert response.status_code == 200, (path, response.text)
    assert viewer.get("/whoami").json()["role"] == "viewer"


def test_only_admins_create_queues_nodes_and_users(team: Team) -> None:
    api = team.api
    node = api.node(team.pool, gpus=1)["name"]
    names = {"queue": unique("q"), "node": unique("n"), "user": unique("u")}
    for client in (team.member, team.viewer):
        for method, path, body in (
            ("POST", "/queues", {"name": names["queue"]}),
            ("PATCH", f"/queues/{team.ours}", {"deserved": 100}),
            ("DELETE", f"/queues/{team.theirs}", None),
            ("POST", "/nodes", {"name": names["node"], "gpus": 8}),
            ("POST", f"/nodes/{node}/cordon", None),
            ("DELETE", f"/nodes/{node}", None),
            ("POST", "/users", {"name": names["user"], "role": "admin"}),
            ("POST", "/users/admin/tokens", None),
        ):
            response = client.request(method, path, json=body)
            assert response.status_code == 403, (method, path, response.text)
    assert api.admin.get(f"/queues/{names['queue']}").status_code == 404
    assert api.admin.get(f"/nodes/{names['node']}").status_code == 404
    assert names["user"] not in {user["name"] for user in api.admin.get("/users").json()}
    assert api.admin.get(f"/queues/{team.ours}").json()["deserved"]["gpu"] == 8
    # The same requests succeed for an admin.
    assert api.admin.post("/queues", json={"name": names["queue"]}).status_code == 201
    assert api.admin.post("/nodes", json={"name": names["node"]}).status_code == 201
    response = api.admin.post("/users", json={"name": names["user"], "role": "viewer"})
    assert response.status_code == 201


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer crl_not-a-real-token", "Bearer", "Basic YWRtaW46YWRtaW4=", "crl_bare"],
)
def test_missing_or_bad_token_is_401(api: Api, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    with httpx.Client(base_url=api.server.api, headers=headers, timeout=30) as client:
        for method, path, body in (
            ("GET", "/workloads", None),
            ("GET", "/workloads/anything", None),
            ("GET", "/queues/anything", None),
            ("POST", "/workloads", {"project": "p", "tasks": [{}]}),
            ("POST", "/queues", {"name": unique("q")}),
            ("DELETE", "/nodes/anything", None),
            ("GET", "/cluster", None),
            ("GET", "/whoami", None),
        ):
            response = client.request(method, path, json=body)
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers.get("www-authenticate", "").lower().startswith("bearer")
            assert "Traceback" not in response.text
    # The admin's token with a wrong character is not the admin's token.
    forged = api.server.token[:-1] + ("A" if api.server.token[-1] != "A" else "B")
    with api.client(forged) as client:
        assert client.get("/whoami").status_code == 401


def test_admin_token_file_is_private_and_not_printed_to_a_log(live_server: Any) -> None:
    path = live_server.data_dir / "admin-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert token == live_server.token and token.startswith("crl_")
    # Its stdout is a file, not a terminal: the token is not printed, only where it is.
    log = live_server.log.read_text()
    assert token not in log
    assert f"admin token written to {path}" in log

    live_server.restart()
    # Same port, so the second start appends to the same log: still one mention.
    log = live_server.log.read_text()
    assert log.count("corral server on") == 2
    assert token not in log
    assert "admin token" not in log.split("corral server on")[-1]
    assert path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with live_server.client() as client:
        assert client.get("/whoami").json()["role"] == "admin"
