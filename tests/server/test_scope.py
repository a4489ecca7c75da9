"""Who reads and changes what, as a table: every route of the OpenAPI document and of the
dashboard × every role (admin, viewer, member, project-admin) × a workload of the
caller's own (own submission, a colleague's) or of another project, on a live server.

A route without a row fails `test_every_route_has_a_row`, so that a new endpoint cannot
ship unscoped. Beyond the status codes, every answer a member gets is searched for the
names of another project's workloads, as an attacker would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import Api, unique

from corral.dashboard.routes import COOKIE, PAGE_PATHS
from corral.sdk.snapshot import pack

ROLES = ("admin", "viewer", "member", "project-admin")
# own: submitted by the member; peer: by someone else in the member's project;
# other: in a project the member does not belong to.
TARGETS = ("own", "peer", "other")

# What kind of route each (method, path) of the OpenAPI document is.
READ_WORKLOAD = "read a workload"
WRITE_WORKLOAD = "change a workload"
SUBMIT = "submit"
READ = "read (scoped content)"
ADMIN = "admin only"
SECRETS = "a project's secrets"
CODE = "a project's code snapshots"
TOKENS = "revoke a token"
PUBLIC = "no token"

ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/api/v1/workloads/{name}"): READ_WORKLOAD,
    ("GET", "/api/v1/workloads/{name}/events"): READ_WORKLOAD,
    ("GET", "/api/v1/workloads/{name}/logs"): READ_WORKLOAD,
    ("GET", "/api/v1/workloads/{name}/why"): READ_WORKLOAD,
    ("GET", "/api/v1/telemetry/workloads/{name}"): READ_WORKLOAD,
    ("DELETE", "/api/v1/workloads/{name}"): WRITE_WORKLOAD,
    ("POST", "/api/v1/workloads/{name}/suspend"): WRITE_WORKLOAD,
    ("POST", "/api/v1/workloads/{name}/resume"): WRITE_WORKLOAD,
    ("POST", "/api/v1/workloads/{name}/cancel"): WRITE_WORKLOAD,
    ("PATCH", "/api/v1/workloads/{name}"): WRITE_WORKLOAD,
    ("POST", "/api/v1/workloads"): SUBMIT,
    ("POST", "/api/v1/workloads/batch"): SUBMIT,
    ("GET", "/api/v1/workloads"): READ,
    ("GET", "/api/v1/history"): READ,
    ("GET", "/api/v1/starts"): READ,
    ("GET", "/api/v1/workspaces/{name}"): READ_WORKLOAD,
    ("GET", "/api/v1/workspaces"): READ,
    ("GET", "/api/v1/queues"): READ,
    ("GET", "/api/v1/queues/{name}"): READ,
    ("GET", "/api/v1/nodes"): READ,
    ("GET", "/api/v1/nodes/{name}"): READ,
    ("GET", "/api/v1/cluster"): READ,
    ("GET", "/api/v1/telemetry/cluster"): READ,
    ("GET", "/api/v1/telemetry/queues"): READ,
    ("GET", "/api/v1/telemetry/devices"): READ,
    ("GET", "/api/v1/usage"): READ,
    ("GET", "/api/v1/whoami"): READ,
    ("GET", "/api/v1/tokens"): READ,
    ("POST", "/api/v1/queues"): ADMIN,
    ("PATCH", "/api/v1/queues/{name}"): ADMIN,
    ("DELETE", "/api/v1/queues/{name}"): ADMIN,
    ("POST", "/api/v1/nodes"): ADMIN,
    ("DELETE", "/api/v1/nodes/{name}"): ADMIN,
    ("POST", "/api/v1/nodes/{name}/cordon"): ADMIN,
    ("POST", "/api/v1/nodes/{name}/uncordon"): ADMIN,
    ("GET", "/api/v1/users"): ADMIN,
    ("POST", "/api/v1/users"): ADMIN,
    ("POST", "/api/v1/users/{name}/tokens"): ADMIN,
    ("PUT", "/api/v1/users/{name}/projects/{project}"): ADMIN,
    ("DELETE", "/api/v1/users/{name}/projects/{project}"): ADMIN,
    ("DELETE", "/api/v1/users/{name}"): ADMIN,
    ("GET", "/api/v1/audit"): ADMIN,
    ("GET", "/api/v1/audit/export"): ADMIN,
    ("DELETE", "/api/v1/tokens/{token_id}"): TOKENS,
    ("GET", "/api/v1/projects/{project}/secrets"): SECRETS,
    ("PUT", "/api/v1/projects/{project}/secrets/{name}"): SECRETS,
    ("DELETE", "/api/v1/projects/{project}/secrets/{name}"): SECRETS,
    ("HEAD", "/api/v1/projects/{project}/code/{digest}"): CODE,
    ("PUT", "/api/v1/projects/{project}/code/{digest}"): CODE,
    ("GET", "/healthz"): PUBLIC,
}
# Dashboard routes (outside the OpenAPI document) that show project data.
DASHBOARD = (*PAGE_PATHS, "/workloads/{name}", "/ui/api/{path}")


@dataclass
class World:
    """Two projects, a user of every role, and running work in both projects."""

    api: Api
    own: str
    other: str
    pool: str
    node: str
    clients: dict[str, httpx.Client]
    users: dict[str, str]
    tokens: dict[str, str]
    running: dict[str, str]  # target -> a running workload

    def fresh(self, target: str, suspended: bool = False) -> str:
        """A new pending workload of `target` (kept pending: no node has its pool)."""
        project = self.other if target == "other" else self.own
        by = self.clients["member"] if target == "own" else None
        body = {"node_selector": {"pool": unique("nowhere")}}
        name = str(self.api.submit(project, self.pool, client=by, **body)["name"])
        if suspended:
            response = self.api.admin.post(f"/workloads/{name}/suspend")
            assert response.status_code == 200, response.text
        return name


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, start_server: Callable[..., Any]
) -> Iterator[World]:
    # The big table runs on SQLite only; test_scope_on_postgresql checks a few rows there.
    server = start_server(tmp_path_factory.mktemp("scope"), None)
    api = Api(server)
    try:
        yield build_world(api)
    finally:
        api.close()
        server.stop()


def build_world(api: Api) -> World:
    """Projects own and other, a user of every role, and a running workload of each
    target, so that nodes, devices, usage and telemetry hold them all."""
    own, other = api.queue("own")["name"], api.queue("other")["name"]
    pool = unique("pool")
    node = api.node(pool, gpus=8)["name"]
    tokens = {"admin": api.server.token}
    users = {"admin": "admin"}
    for role in ("viewer", "member", "project-admin"):
        name = unique(role.replace("-", ""))
        body: dict[str, Any] = {"name": name, "role": "viewer" if role == "viewer" else "member"}
        if role != "viewer":
            body["project"] = own
        response = api.admin.post("/users", json=body)
        assert response.status_code == 201, response.text
        tokens[role], users[role] = response.json()["token"], name
    response = api.admin.put(
        f"/users/{users['project-admin']}/projects/{own}", json={"role": "project-admin"}
    )
    assert response.status_code == 200, response.text
    clients = {role: api.client(token) for role, token in tokens.items()}
    world = World(api, own, other, pool, node, clients, users, tokens, {})
    for target in TARGETS:
        project = other if target == "other" else own
        by = clients["member"] if target == "own" else None
        world.running[target] = api.submit(project, pool, client=by)["name"]
    for name in world.running.values():
        api.wait_status(name, "running")
    return world


def path_of(world: World, path: str, target: str) -> str:
    """The route's path with its parameters filled for `target`."""
    values = {
        "{name}": world.running[target],
        "{project}": world.own,
    }
    for key, value in values.items():
        path = path.replace(key, value)
    return path.removeprefix("/api/v1")


def leaks(world: World, role: str, text: str) -> None:
    """A member or project-admin never reads the name of another project's workload."""
    if role in ("member", "project-admin"):
        assert world.running["other"] not in text, text[:2000]


def ghost_detail(client: httpx.Client, method: str, path: str, name: str) -> str:
    """What the same request answers for a workload that does not exist, `name` put back."""
    ghost = unique("ghost")
    response = client.request(method, path.replace(name, ghost))
    assert response.status_code == 404, response.text
    return str(response.json()["detail"]).replace(ghost, name)


def test_every_route_has_a_row(world: World) -> None:
    document = world.api.admin.get("/openapi.json").json()
    found = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    assert found == set(ROUTES), (
        f"routes without a row: {sorted(found - set(ROUTES))}; "
        f"rows without a route: {sorted(set(ROUTES) - found)}"
    )


def _cases(kind: str) -> list[Any]:
    return [
        pytest.param(method, path, role, target, id=f"{method} {path} {role} {target}")
        for (method, path), each in ROUTES.items()
        if each == kind
        for role in ROLES
        for target in TARGETS
    ]


@pytest.mark.parametrize(("method", "path", "role", "target"), _cases(READ_WORKLOAD))
def test_reading_a_workload(world: World, method: str, path: str, role: str, target: str) -> None:
    client, name = world.clients[role], world.running[target]
    url = path_of(world, path, target)
    response = client.request(method, url)
    if role in ("member", "project-admin") and target == "other":
        # The very answer of a workload that does not exist: the name does not leak.
        assert response.status_code == 404, response.text
        assert response.json()["detail"] == ghost_detail(client, method, url, name)
    else:
        assert response.status_code == 200, response.text
        leaks(world, role, response.text)


MANAGES = {
    "admin": {"own": True, "peer": True, "other": True},
    "viewer": {"own": False, "peer": False, "other": False},
    "member": {"own": True, "peer": False, "other": False},
    "project-admin": {"own": True, "peer": True, "other": False},
}
SUCCESS = {"DELETE": 204, "POST": 200, "PATCH": 200}
# The body of each change (None: none).
CHANGES = {"PATCH": {"priority": 75}}


@pytest.mark.parametrize(("method", "path", "role", "target"), _cases(WRITE_WORKLOAD))
def test_changing_a_workload(world: World, method: str, path: str, role: str, target: str) -> None:
    name = world.fresh(target, suspended=path.endswith("/resume"))
    before = world.api.workload(name)
    url = path.replace("{name}", name)[len("/api/v1") :]
    response = world.clients[role].request(method, url, json=CHANGES.get(method))
    if MANAGES[role][target]:
        assert response.status_code == SUCCESS[method], response.text
        return
    outsider = role in ("member", "project-admin") and target == "other"
    assert response.status_code == (404 if outsider else 403), response.text
    leaks(world, role, response.text)
    after = world.api.workload(name)
    assert (after["status"], after["attempts"]) == (before["status"], before["attempts"])
    assert after["priority"] == before["priority"]
    events = world.api.admin.get(f"/workloads/{name}/events").json()
    assert not any(world.users[role] in event["cause"] for event in events), events


@pytest.mark.parametrize(
    ("method", "path", "role", "target"),
    [case for case in _cases(SUBMIT) if case.values[3] != "peer"],
)
def test_submitting(world: World, method: str, path: str, role: str, target: str) -> None:
    project = world.other if target == "other" else world.own
    name = unique("sub")
    item = {"name": name, "project": project, "tasks": [{"gpu": 1}]}
    body = {"workloads": [item]} if path.endswith("/batch") else item
    response = world.clients[role].request(method, path[len("/api/v1") :], json=body)
    allowed = role == "admin" or (role in ("member", "project-admin") and target == "own")
    if allowed:
        assert response.status_code == 201, response.text
    else:
        assert response.status_code == 403, response.text
        assert world.api.admin.get(f"/workloads/{name}").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "role"),
    [
        pytest.param(method, path, role, id=f"{method} {path} {role}")
        for (method, path), kind in ROUTES.items()
        if kind in (READ, PUBLIC)
        for role in ROLES
    ],
)
def test_reading_the_cluster(world: World, method: str, path: str, role: str) -> None:
    url = path.replace("{name}", world.node if "/nodes/" in path else world.own)
    url = url.removeprefix("/api/v1") if url.startswith("/api/v1") else world.api.server.url + url
    client = world.clients[role]
    params = {"by": "workload", "since": "1h"} if url == "/usage" else None
    response = client.request(method, url, params=params)
    assert response.status_code == 200, response.text
    leaks(world, role, response.text)
    member = role in ("member", "project-admin")
    if url == "/workloads":
        names = {w["name"] for w in response.json()}
        expected = {world.running["own"], world.running["peer"]}
        if not member:
            expected.add(world.running["other"])
        assert expected <= names and (world.running["other"] in names) == (not member)
    if url == "/telemetry/queues":
        assert (world.other in response.json()["series"]) == (not member)
    if url == "/nodes/" + world.node:
        tasks = response.json()["tasks"]
        # A member still sees that the GPUs are taken, and by which project.
        assert {t["project"] for t in tasks} == {world.own, world.other}


@pytest.mark.parametrize("role", ["member", "project-admin"])
def test_members_filters_show_nothing_of_other_projects(world: World, role: str) -> None:
    client = world.clients[role]
    for params in (
        {"project": world.other},
        {"user": "admin"},
        {"status": "running"},
    ):
        response = client.get("/workloads", params=params)
        assert response.status_code == 200, response.text
        assert all(w["project"] == world.own for w in response.json()), response.text
    for by in ("project", "department", "user", "workload"):
        response = client.get("/usage", params={"by": by})
        assert response.status_code == 200, response.text
        leaks(world, role, response.text)
        if by == "project":
            assert {row["key"] for row in response.json()} <= {world.own}, response.text
    response = client.get("/usage", params={"format": "csv", "by": "workload"})
    leaks(world, role, response.text)
    for params in ({"project": world.other}, {"user": "admin"}, {"state": "running"}, {}):
        response = client.get("/history", params=params)
        assert response.status_code == 200, response.text
        assert all(row["project"] == world.own for row in response.json()), response.text
    response = client.get("/starts", params={"project": world.other})
    assert response.status_code == 200 and response.json() == [], response.text


ADMIN_BODIES: dict[tuple[str, str], Callable[[World], tuple[str, Any, int]]] = {
    ("POST", "/api/v1/queues"): lambda w: ("/queues", {"name": unique("aq")}, 201),
    ("PATCH", "/api/v1/queues/{name}"): lambda w: (
        f"/queues/{w.api.queue('pq')['name']}",
        {"deserved": 4},
        200,
    ),
    ("DELETE", "/api/v1/queues/{name}"): lambda w: (
        f"/queues/{w.api.queue('dq')['name']}",
        None,
        204,
    ),
    ("POST", "/api/v1/nodes"): lambda w: ("/nodes", {"name": unique("an")}, 201),
    ("DELETE", "/api/v1/nodes/{name}"): lambda w: (
        f"/nodes/{w.api.node(unique('np'))['name']}",
        None,
        204,
    ),
    ("POST", "/api/v1/nodes/{name}/cordon"): lambda w: (f"/nodes/{w.node}/cordon", None, 200),
    ("POST", "/api/v1/nodes/{name}/uncordon"): lambda w: (f"/nodes/{w.node}/uncordon", None, 200),
    ("GET", "/api/v1/users"): lambda w: ("/users", None, 200),
    ("POST", "/api/v1/users"): lambda w: ("/users", {"name": unique("au"), "role": "viewer"}, 201),
    ("POST", "/api/v1/users/{name}/tokens"): lambda w: (
        f"/users/{w.users['viewer']}/tokens",
        None,
        201,
    ),
    ("PUT", "/api/v1/users/{name}/projects/{project}"): lambda w: (
        f"/users/{w.users['member']}/projects/{w.own}",
        {"role": "member"},
        200,
    ),
    ("DELETE", "/api/v1/users/{name}/projects/{project}"): lambda w: (
        f"/users/{_spare_member(w)}/projects/{w.own}",
        None,
        204,
    ),
    ("DELETE", "/api/v1/users/{name}"): lambda w: (f"/users/{_spare_member(w)}", None, 204),
    ("GET", "/api/v1/audit"): lambda w: ("/audit", None, 200),
    ("GET", "/api/v1/audit/export"): lambda w: ("/audit/export", None, 200),
}


def _spare_member(world: World) -> str:
    name = unique("spare")
    response = world.api.admin.post("/users", json={"name": name, "project": world.own})
    assert response.status_code == 201, response.text
    return name


@pytest.mark.parametrize(
    ("method", "path", "role"),
    [
        pytest.param(method, path, role, id=f"{method} {path} {role}")
        for (method, path), kind in ROUTES.items()
        if kind == ADMIN
        for role in ROLES
    ],
)
def test_admin_routes(world: World, method: str, path: str, role: str) -> None:
    url, body, success = ADMIN_BODIES[(method, path)](world)
    response = world.clients[role].request(method, url, json=body)
    if role == "admin":
        assert response.status_code == success, response.text
    else:
        assert response.status_code == 403, response.text
        if role == "member" and "projects" in url:
            # A member cannot give themself another project or a higher role.
            me = world.clients["member"].get("/whoami").json()
            assert me["projects"] == [{"project": world.own, "role": "member"}]


@pytest.mark.parametrize(
    ("method", "path", "role", "target"),
    [case for case in _cases(SECRETS) if case.values[3] != "peer"],
)
def test_secrets(world: World, method: str, path: str, role: str, target: str) -> None:
    """A project's members (either role) and admins set, list and delete its secrets;
    viewers and other projects' members get 403, and change nothing."""
    project = world.other if target == "other" else world.own
    name = unique("S").replace("-", "_")
    value = unique("value")
    made = world.api.admin.put(f"/projects/{project}/secrets/{name}", json={"value": value})
    assert made.status_code == 204, made.text
    url = path.removeprefix("/api/v1").replace("{project}", project).replace("{name}", name)
    body = {"value": unique("new")} if method == "PUT" else None
    response = world.clients[role].request(method, url, json=body)
    allowed = role == "admin" or (role in ("member", "project-admin") and target == "own")
    if allowed:
        assert response.status_code == (200 if method == "GET" else 204), response.text
        if method == "GET":
            assert name in {s["name"] for s in response.json()}
    else:
        assert response.status_code == 403, response.text
        assert name not in response.text
        listed = world.api.admin.get(f"/projects/{project}/secrets").json()
        assert name in {s["name"] for s in listed}
    assert value not in response.text


@pytest.mark.parametrize(
    ("method", "path", "role", "target"),
    [case for case in _cases(CODE) if case.values[3] != "peer"],
)
def test_code_snapshots(
    world: World, tmp_path: Path, method: str, path: str, role: str, target: str
) -> None:
    """Who may submit to a project may ask for and upload its code snapshots; viewers
    and other projects' members get 403 before anything is read, and learn nothing of
    whether the project has the tree (corral.api.routers.code)."""
    project = world.other if target == "other" else world.own
    (tmp_path / "train.py").write_text(f"print({unique('tree')!r})\n")
    snapshot = pack(tmp_path)
    url = f"/projects/{project}/code/{snapshot.digest}"
    made = world.api.admin.put(url, content=snapshot.data)
    assert made.status_code == 201, made.text
    body = snapshot.data if method == "PUT" else None
    response = world.clients[role].request(method, url, content=body)
    allowed = role == "admin" or (role in ("member", "project-admin") and target == "own")
    assert response.status_code == (200 if allowed else 403), response.text


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("whose", ["own", "another's"])
def test_revoking_a_token(world: World, role: str, whose: str) -> None:
    """Anyone revokes their own tokens; only admins revoke another user's (to others,
    another's token is one that does not exist: 404)."""
    owner = (
        world.users[role]
        if whose == "own"
        else world.users["viewer" if role != "viewer" else "member"]
    )
    made = world.api.admin.post(f"/users/{owner}/tokens", json={"name": unique("t")})
    assert made.status_code == 201, made.text
    token_id = made.json()["id"]
    response = world.clients[role].delete(f"/tokens/{token_id}")
    if role == "admin" or whose == "own":
        assert response.status_code == 204, response.text
    else:
        assert response.status_code == 404, response.text
        listed = world.api.admin.get("/tokens", params={"user": owner}).json()
        assert any(t["id"] == token_id and t["revoked_at"] is None for t in listed), listed


def test_every_dashboard_route_has_a_row() -> None:
    assert set(DASHBOARD) == {*PAGE_PATHS, "/workloads/{name}", "/ui/api/{path}"}


@pytest.mark.parametrize("role", ROLES)
def test_dashboard(world: World, role: str) -> None:
    base = world.api.server.url
    member = role in ("member", "project-admin")
    with httpx.Client(base_url=base, cookies={COOKIE: world.tokens[role]}, timeout=30) as page:
        for path in PAGE_PATHS:
            response = page.get(path)
            assert response.status_code == 200, (path, response.text[:500])
            leaks(world, role, response.text)
        other = world.running["other"]
        for path in (f"/workloads/{other}", f"/ui/api/workloads/{other}"):
            response = page.get(path)
            assert response.status_code == (404 if member else 200), (path, response.text[:500])
        response = page.get(f"/workloads/{world.running['own']}")
        assert response.status_code == 200
        for path in ("/ui/api/workloads", "/ui/api/nodes", "/ui/api/telemetry/devices"):
            response = page.get(path)
            assert response.status_code == 200, (path, response.text[:500])
            leaks(world, role, response.text)


def test_memberships_take_effect_at_once(world: World) -> None:
    """A member added to the other project reads it at once; removed, they read it no
    longer (the server forgets remembered users on every change of accounts)."""
    api, name = world.api, unique("mover")
    token = api.admin.post("/users", json={"name": name, "project": world.own}).json()["token"]
    mover = api.client(token)
    target = f"/workloads/{world.running['other']}"
    assert mover.get(target).status_code == 404
    assert api.admin.put(f"/users/{name}/projects/{world.other}", json={}).status_code == 200
    assert mover.get(target).status_code == 200
    # A member of both submits to both, and manages only what they submitted.
    mine = api.submit(world.other, world.pool, client=mover, node_selector={"pool": "none"})
    assert mover.post(f"{target}/suspend").status_code == 403
    assert mover.post(f"/workloads/{mine['name']}/suspend").status_code == 200
    assert api.admin.delete(f"/users/{name}/projects/{world.other}").status_code == 204
    assert mover.get(target).status_code == 404
    assert mover.get(f"/workloads/{mine['name']}").status_code == 404
    # Taken out of every project, a member reads and submits nothing.
    assert api.admin.delete(f"/users/{name}/projects/{world.own}").status_code == 204
    assert mover.get("/workloads").json() == []
    response = mover.post("/workloads", json={"project": world.own, "tasks": [{"gpu": 1}]})
    assert response.status_code == 403
    mover.close()


def test_membership_errors(world: World) -> None:
    admin = world.api.admin
    viewer = world.users["viewer"]
    response = admin.put(f"/users/{viewer}/projects/{world.own}", json={})
    assert response.status_code == 422, response.text
    response = admin.put(f"/users/{world.users['member']}/projects/{world.own}", json={"role": "x"})
    assert response.status_code == 422, response.text
    response = admin.put(f"/users/{world.users['member']}/projects/{unique('nope')}", json={})
    assert response.status_code == 422, response.text
    response = admin.put(f"/users/{unique('nobody')}/projects/{world.own}", json={})
    assert response.status_code == 404, response.text


def test_scope_on_postgresql(
    tmp_path_factory: pytest.TempPathFactory,
    start_server: Callable[..., Any],
    postgres: Callable[[], str],
) -> None:
    """A few rows of the table on PostgreSQL: the queries that filter by project."""
    server = start_server(tmp_path_factory.mktemp("scope-pg"), postgres())
    api = Api(server)
    try:
        world = build_world(api)
        member = world.clients["member"]
        other = world.running["other"]
        assert member.get(f"/workloads/{other}").status_code == 404
        assert member.delete(f"/workloads/{other}").status_code == 404
        assert member.post(f"/workloads/{world.running['peer']}/suspend").status_code == 403
        pa = world.clients["project-admin"]
        assert pa.post(f"/workloads/{world.running['peer']}/suspend").status_code == 200
        for path in ("/workloads", "/usage", "/nodes", "/telemetry/devices"):
            response = member.get(path, params={"by": "workload"} if path == "/usage" else None)
            assert response.status_code == 200, response.text
            leaks(world, "member", response.text)
        names = {w["name"] for w in world.clients["viewer"].get("/workloads").json()}
        assert other in names
    finally:
        api.close()
        server.stop()


def test_node_view_holds_the_work(world: World) -> None:
    """The table's node rows mean something only when the work is bound to the node."""
    node = world.api.admin.get(f"/nodes/{world.node}").json()
    assert {t["workload"] for t in node["tasks"]} >= set(world.running.values())
