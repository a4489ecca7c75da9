"""The REST API of a real `corral server` process, on SQLite and on PostgreSQL.

Most tests share one server per backend (`api`) and keep out of each other's way with
names of their own and nodes in a pool of their own; the cluster summary needs a store to
itself and gets a fresh server (`live_server`). Every client here fails a test when an
error body carries a traceback (see server_support.no_traceback).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_support import Api, checked, locs, names_field, unique, wait_for

GIB = 1 << 30
_JSON = {"content-type": "application/json"}
# What a queue is configured with; fair share and usage move with every cycle.
_QUEUE_FIELDS = (
    "name",
    "parent",
    "deserved",
    "limit",
    "over_quota_weight",
    "priority",
    "preempt_min_runtime",
    "reclaim_min_runtime",
    "fair_share_half_life",
    "fair_share_k",
    "reserve_after",
)


def _config(queue: dict[str, Any]) -> dict[str, Any]:
    return {key: queue[key] for key in _QUEUE_FIELDS}


# -- queues -------------------------------------------------------------------------------


def test_queue_create_list_get_update_delete(api: Api) -> None:
    department = api.queue("dept", deserved=16, limit=32)
    project = api.queue(
        "proj",
        parent=department["name"],
        deserved={"gpu": 2, "cpu": 8, "memory": "16GiB"},
        limit={"gpu": 4},
        over_quota_weight=3,
        priority=7,
    )
    assert project["parent"] == department["name"]
    assert project["deserved"] == {"gpu": 2.0, "cpu": 8.0, "memory": 16 * GIB}
    # Left out: CPU and memory are not limited; GPUs left out of deserved would be 0.
    assert project["limit"] == {"gpu": 4.0, "cpu": None, "memory": None}
    assert project["over_quota_weight"] == {"gpu": 3.0, "cpu": 3.0, "memory": 3}
    assert project["priority"] == 7
    assert project["department"] is False and project["children"] == []

    fetched = api.admin.get(f"/queues/{department['name']}").json()
    assert fetched["department"] is True
    assert fetched["children"] == [project["name"]]
    assert fetched["deserved"]["gpu"] == 16 and fetched["limit"]["gpu"] == 32
    listed = {queue["name"]: queue for queue in api.admin.get("/queues").json()}
    assert listed[project["name"]]["deserved"] == project["deserved"]
    assert listed[department["name"]]["children"] == [project["name"]]

    response = api.admin.patch(f"/queues/{project['name']}", json={"priority": 9, "deserved": 3})
    assert response.status_code == 200, response.text
    changed = response.json()
    assert changed["priority"] == 9
    assert changed["deserved"] == {"gpu": 3.0, "cpu": None, "memory": None}
    # Fields left out of the PATCH stay as they were.
    assert changed["limit"]["gpu"] == 4 and changed["over_quota_weight"]["gpu"] == 3
    assert _config(api.admin.get(f"/queues/{project['name']}").json()) == _config(changed)

    response = api.admin.patch(f"/queues/{project['name']}", json={"limit": None})
    assert response.json()["limit"] == {"gpu": None, "cpu": None, "memory": None}

    # A department with a child cannot go first.
    response = api.admin.delete(f"/queues/{department['name']}")
    assert response.status_code == 409, response.text
    assert project["name"] in response.json()["detail"] or "child" in response.json()["detail"]
    assert api.admin.delete(f"/queues/{project['name']}").status_code == 204
    assert api.admin.get(f"/queues/{project['name']}").status_code == 404
    assert api.admin.delete(f"/queues/{department['name']}").status_code == 204
    names = {queue["name"] for queue in api.admin.get("/queues").json()}
    assert department["name"] not in names and project["name"] not in names


def test_queue_unknown_is_404(api: Api) -> None:
    name = unique("missing")
    for response in (
        api.admin.get(f"/queues/{name}"),
        api.admin.patch(f"/queues/{name}", json={"priority": 1}),
        api.admin.delete(f"/queues/{name}"),
    ):
        assert response.status_code == 404, response.text
        assert name in response.json()["detail"]


def test_queue_duplicate_name_is_409(api: Api) -> None:
    queue = api.queue(deserved=1)
    response = api.admin.post("/queues", json={"name": queue["name"], "deserved": 5})
    assert response.status_code == 409, response.text
    assert queue["name"] in response.json()["detail"]
    # The first one is untouched.
    assert api.admin.get(f"/queues/{queue['name']}").json()["deserved"]["gpu"] == 1


def test_queue_parent_must_exist(api: Api) -> None:
    name, parent = unique("orphan"), unique("nobody")
    response = api.admin.post("/queues", json={"name": name, "parent": parent})
    assert names_field(response, "parent"), response.text
    assert api.admin.get(f"/queues/{name}").status_code == 404

    queue = api.queue()
    response = api.admin.patch(f"/queues/{queue['name']}", json={"parent": parent})
    assert names_field(response, "parent"), response.text
    assert api.admin.get(f"/queues/{queue['name']}").json()["parent"] is None


def test_queue_patch_parent_cannot_make_a_cycle(api: Api) -> None:
    top = api.queue("top")
    middle = api.queue("middle", parent=top["name"])
    bottom = api.queue("bottom", parent=middle["name"])
    for parent in (bottom["name"], middle["name"], top["name"]):
        response = api.admin.patch(f"/queues/{top['name']}", json={"parent": parent})
        assert names_field(response, "parent"), response.text
    assert api.admin.get(f"/queues/{top['name']}").json()["parent"] is None
    assert api.admin.get(f"/queues/{bottom['name']}").json()["parent"] == middle["name"]
    # Moving a subtree elsewhere is fine.
    other = api.queue("other")
    response = api.admin.patch(f"/queues/{middle['name']}", json={"parent": other["name"]})
    assert response.status_code == 200, response.text
    assert api.admin.get(f"/queues/{other['name']}").json()["children"] == [middle["name"]]
    assert api.admin.get(f"/queues/{top['name']}").json()["children"] == []


def _flat(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """("body", "limit.gpu") and ("body", "limit", "gpu") name the same field."""
    parts: list[Any] = []
    for part in loc:
        parts.extend(part.split(".") if isinstance(part, str) else [part])
    return tuple(parts)


def _names(response: httpx.Response, *path: Any) -> bool:
    wanted = ("body", *path)
    return any(_flat(loc)[: len(wanted)] == wanted for loc in locs(response))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"deserved": -1}, ("deserved",)),
        ({"deserved": {"gpu": -1}}, ("deserved",)),
        ({"deserved": {"cpu": -0.5}}, ("deserved",)),
        ({"limit": -1}, ("limit",)),
        ({"limit": {"memory": -5}}, ("limit",)),
        ({"over_quota_weight": -2}, ("over_quota_weight",)),
        ({"deserved": 4, "limit": 2}, ("limit", "gpu")),
        ({"deserved": {"gpu": 1, "cpu": 8}, "limit": {"cpu": 4}}, ("limit", "cpu")),
        ({"deserved": {"memory": "2GiB"}, "limit": {"memory": "1GiB"}}, ("limit", "memory")),
        ({"deserved": {"memory": "lots"}}, ("deserved",)),
        ({"deserved": float("inf")}, ("deserved",)),
        ({"priority": 10**7}, ("priority",)),
        ({"reclaim_min_runtime": "soon"}, ("reclaim_min_runtime",)),
        ({"reclaim_min_runtime": 0}, ("reclaim_min_runtime",)),
        ({"preempt_min_runtime": -60}, ("preempt_min_runtime",)),
        ({"preempt_min_runtime": "20y"}, ("preempt_min_runtime",)),
        ({"preempt_min_runtime": True}, ("preempt_min_runtime",)),
        ({"fair_share_half_life": "a day"}, ("fair_share_half_life",)),
        ({"fair_share_half_life": 0}, ("fair_share_half_life",)),
        ({"fair_share_k": -1}, ("fair_share_k",)),
        ({"fair_share_k": 1000}, ("fair_share_k",)),
        ({"fair_share_k": True}, ("fair_share_k",)),
        ({"fair_share_k": "1"}, ("fair_share_k",)),
        ({"reserve_after": "later"}, ("reserve_after",)),
        ({"reserve_after": -1}, ("reserve_after",)),
        ({"reserve_after": "0s"}, ("reserve_after",)),
    ],
)
def test_queue_quotas_are_validated(api: Api, body: dict[str, Any], field: tuple[str]) -> None:
    name = unique("bad")
    response = api.admin.post("/queues", content=json.dumps({"name": name, **body}), headers=_JSON)
    assert _names(response, *field), response.text
    assert api.admin.get(f"/queues/{name}").status_code == 404
    # The same values are refused when patched in, and the queue stays as it was.
    queue = api.queue(deserved=1, limit=2)
    response = api.admin.patch(f"/queues/{queue['name']}", content=json.dumps(body), headers=_JSON)
    assert _names(response, *field), response.text
    assert _config(api.admin.get(f"/queues/{queue['name']}").json()) == _config(queue)


def test_queue_time_decay_is_set_changed_and_inherited_again(api: Api) -> None:
    queue = api.queue(fair_share_half_life="24h", fair_share_k=2)
    assert (queue["fair_share_half_life"], queue["fair_share_k"]) == (86400, 2)
    path = f"/queues/{queue['name']}"
    response = api.admin.patch(path, json={"fair_share_k": 0.5})
    assert response.status_code == 200, response.text
    assert (response.json()["fair_share_half_life"], response.json()["fair_share_k"]) == (
        86400,
        0.5,
    )
    response = api.admin.patch(path, json={"fair_share_half_life": None})
    assert response.json()["fair_share_half_life"] is None
    assert api.admin.get(path).json()["fair_share_k"] == 0.5
    # Off: no effective weight, and nothing to explain.
    listed = {q["name"]: q for q in api.admin.get("/queues").json()}
    assert listed[queue["name"]]["weight_reason"] is None


def test_queue_min_runtimes_are_set_changed_and_inherited_again(api: Api) -> None:
    queue = api.queue(reclaim_min_runtime="10m")
    assert (queue["preempt_min_runtime"], queue["reclaim_min_runtime"]) == (None, 600)
    path = f"/queues/{queue['name']}"
    response = api.admin.patch(path, json={"preempt_min_runtime": 90})
    assert response.status_code == 200, response.text
    # A field left out stays; null takes the setting off (the parent's applies again).
    assert (response.json()["preempt_min_runtime"], response.json()["reclaim_min_runtime"]) == (
        90,
        600,
    )
    response = api.admin.patch(path, json={"reclaim_min_runtime": None})
    assert response.json()["reclaim_min_runtime"] is None
    assert api.admin.get(path).json()["preempt_min_runtime"] == 90


def test_queue_reserve_after_is_set_and_inherited_again(api: Api) -> None:
    queue = api.queue(reserve_after="30m")
    assert queue["reserve_after"] == 1800
    path = f"/queues/{queue['name']}"
    response = api.admin.patch(path, json={"priority": 50})
    assert response.json()["reserve_after"] == 1800
    response = api.admin.patch(path, json={"reserve_after": None})
    assert response.status_code == 200, response.text
    assert api.admin.get(path).json()["reserve_after"] is None


def test_limit_equal_to_deserved_is_accepted(api: Api) -> None:
    queue = api.queue(deserved={"gpu": 2, "cpu": 4}, limit={"gpu": 2, "cpu": 4})
    assert queue["limit"]["gpu"] == 2 and queue["limit"]["cpu"] == 4
    response = api.admin.patch(f"/queues/{queue['name']}", json={"deserved": 0, "limit": 0})
    assert response.status_code == 200, response.text


def test_queue_holding_workloads_cannot_be_deleted(api: Api) -> None:
    queue = api.queue()
    workload = api.submit(queue["name"], unique("nowhere"))
    response = api.admin.delete(f"/queues/{queue['name']}")
    assert response.status_code == 409, response.text
    assert api.admin.get(f"/queues/{queue['name']}").status_code == 200
    assert api.workload(workload["name"])["status"] == "pending"
    # Nor can a queue holding work become a department.
    response = api.admin.post("/queues", json={"name": unique("sub"), "parent": queue["name"]})
    assert names_field(response, "parent"), response.text
    assert api.admin.delete(f"/workloads/{workload['name']}").status_code == 204
    assert api.admin.delete(f"/queues/{queue['name']}").status_code == 204


def test_422_names_each_bad_field(api: Api) -> None:
    response = api.admin.post(
        "/queues", json={"name": "Not A Name", "priority": "high", "surprise": 1}
    )
    found = set(locs(response))
    assert ("body", "name") in found
    assert ("body", "priority") in found
    assert ("body", "surprise") in found

    response = api.admin.post(
        "/workloads",
        json={
            "project": "UPPER",
            "tasks": [{"replicas": 0, "gpu": 1.5}, {"name": "b", "memory": "much"}],
            "backoff_limit": -1,
            "env": {"1x": "value"},
            "max_runtime": "forever",
        },
    )
    found = {_flat(loc)[:4] for loc in locs(response)}
    for wanted in (
        ("body", "project"),
        ("body", "tasks", 0, "replicas"),
        ("body", "tasks", 0, "gpu"),
        ("body", "tasks", 1, "memory"),
        ("body", "backoff_limit"),
        ("body", "max_runtime"),
    ):
        assert any(loc[: len(wanted)] == wanted for loc in found), (wanted, response.text)
    assert any(loc[:3] == ("body", "env", "1x") for loc in found), response.text

    response = api.admin.post("/nodes", json={"name": "n", "gpus": -1, "cpu": "many"})
    assert {("body", "gpus"), ("body", "cpu")} <= set(locs(response))

    response = api.admin.post("/workloads", content=b"{not json", headers=_JSON)
    assert locs(response)[0][0] == "body"
    response = api.admin.get("/workloads", params={"status": "sleeping"})
    assert ("query", "status") in set(locs(response))


# -- workloads ----------------------------------------------------------------------------


def test_submit_get_list_with_filters(api: Api) -> None:
    first, second = api.queue(), api.queue()
    pool = unique("pool")
    response = api.admin.post(
        "/users", json={"name": unique("user"), "role": "member", "project": second["name"]}
    )
    assert response.status_code == 201, response.text
    member = response.json()
    with api.client(member["token"]) as as_member:
        mine = api.submit(second["name"], pool, client=as_member, name=unique("mine"))
    a = api.submit(first["name"], pool, name=unique("a"), priority="inference", env={"K": "v"})
    b = api.submit(first["name"], pool, gpu=0.5, replicas=2, command=["python", "-c", "1"])
    assert a["status"] == "pending" and a["user"] == "admin" and a["project"] == first["name"]
    assert a["priority"] == 125 and a["preemptible"] is False and a["env"] == {"K": "v"}
    assert b["name"].startswith(first["name"] + "-")  # generated from the project
    assert b["tasks"] == [
        {"name": "worker", "replicas": 2, "gpu": 0.5, "gpu_memory": 0, "cpu": 0.0, "memory": 0}
    ]
    assert b["preemptible"] is True and b["command"] == ["python", "-c", "1"]
    assert mine["user"] == member["user"]
    assert api.workload(a["name"])["created_at"] == a["created_at"]

    def names(**params: str) -> list[str]:
        response = api.admin.get("/workloads", params=params)
        assert response.status_code == 200, response.text
        return [workload["name"] for workload in response.json()]

    assert names(project=first["name"]) == [a["name"], b["name"]]
    assert names(project=second["name"]) == [mine["name"]]
    assert names(user=member["user"]) == [mine["name"]]
    assert {a["name"], b["name"], mine["name"]} <= set(names())
    assert names(project=first["name"], user=member["user"]) == []
    assert names(project=unique("none")) == []
    response = api.admin.post(f"/workloads/{a['name']}/suspend")
    assert response.status_code == 200, response.text
    assert names(project=first["name"], status="suspended") == [a["name"]]
    assert names(project=first["name"], status="pending") == [b["name"]]
    assert names(project=first["name"], status="running") == []


def test_submit_validation_against_the_store(api: Api) -> None:
    pool = unique("pool")
    response = api.admin.post(
        "/workloads", json={"project": unique("ghost"), "tasks": [{"gpu": 1}]}
    )
    assert names_field(response, "project"), response.text
    department = api.queue("dept")
    api.queue("leaf", parent=department["name"])
    response = api.admin.post("/workloads", json={"project": department["name"], "tasks": [{}]})
    assert names_field(response, "project"), response.text
    assert api.admin.get("/workloads", params={"project": department["name"]}).json() == []

    project = api.queue()
    taken = api.submit(project["name"], pool, name=unique("taken"))
    response = api.admin.post(
        "/workloads", json={"name": taken["name"], "project": project["name"], "tasks": [{}]}
    )
    assert response.status_code == 409, response.text
    assert len(api.admin.get("/workloads", params={"project": project["name"]}).json()) == 1


def test_batch_submission_is_all_or_nothing(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()["name"]
    names = [unique("batch") for _ in range(3)]

    def body(name: str | None, **fields: Any) -> dict[str, Any]:
        named = {"name": name} if name else {}
        return {
            "project": project,
            "tasks": [{"gpu": 1}],
            "node_selector": {"pool": pool},
            **named,
            **fields,
        }

    def stored() -> list[str]:
        listed = api.admin.get("/workloads", params={"project": project}).json()
        return sorted(workload["name"] for workload in listed)

    # A field the schema refuses, in the third: named by its place; nothing stored.
    bad = [body(names[0]), body(names[1]), body(names[2], tasks=[{"gpu": 1.5}])]
    response = api.admin.post("/workloads/batch", json={"workloads": bad})
    assert names_field(response, "workloads", 2, "tasks", 0, "gpu"), response.text
    assert stored() == []
    # A check only the store can make (no such project), in the second.
    bad = [body(names[0]), body(names[1], project=unique("ghost")), body(names[2])]
    response = api.admin.post("/workloads/batch", json={"workloads": bad})
    assert locs(response) == [("body", "workloads", 1, "project")]
    assert stored() == []
    # The same name twice, and a name that exists.
    response = api.admin.post(
        "/workloads/batch", json={"workloads": [body(names[0]), body(names[0])]}
    )
    assert response.status_code == 409 and "twice" in response.json()["detail"]
    taken = api.submit(project, pool, name=unique("taken"))["name"]
    response = api.admin.post("/workloads/batch", json={"workloads": [body(names[0]), body(taken)]})
    assert response.status_code == 409 and taken in response.json()["detail"]
    assert stored() == [taken]
    # All good: all stored, in order, with server-made names where none was given.
    response = api.admin.post(
        "/workloads/batch", json={"workloads": [body(names[0]), body(None), body(names[2])]}
    )
    assert response.status_code == 201, response.text
    made = [workload["name"] for workload in response.json()]
    assert made[0] == names[0] and made[2] == names[2]
    assert made[1].startswith(f"{project}-")
    assert stored() == sorted([taken, *made])
    for name in made:
        assert api.workload(name)["status"] in ("pending", "running")
    assert api.admin.post("/workloads/batch", json={"workloads": []}).status_code == 422


def test_unknown_workload_is_404(api: Api) -> None:
    name = unique("nothing")
    for method, path in (
        ("GET", f"/workloads/{name}"),
        ("DELETE", f"/workloads/{name}"),
        ("POST", f"/workloads/{name}/suspend"),
        ("POST", f"/workloads/{name}/resume"),
        ("GET", f"/workloads/{name}/events"),
        ("GET", f"/workloads/{name}/why"),
    ):
        response = api.admin.request(method, path)
        assert response.status_code == 404, (method, path, response.text)
        assert name in response.json()["detail"]


def test_scheduler_binds_to_registered_nodes(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()
    nodes = {api.node(pool, gpus=4)["name"], api.node(pool, gpus=4)["name"]}
    gang = api.submit(project["name"], pool, gpu=2, replicas=3)
    running = api.wait_status(gang["name"], "running")
    assert running["reason"] is None and running["attempts"] == 1
    assert running["started_at"] >= running["created_at"]
    placements = running["placements"]
    assert sorted(p["task"] for p in placements) == [0, 1, 2]
    assert {p["node"] for p in placements} <= nodes
    used: set[tuple[str, int]] = set()
    for placement in placements:
        assert len(placement["devices"]) == 2 and placement["gpu"] == 2
        for device in placement["devices"]:
            assert 0 <= device < 4
            assert (placement["node"], device) not in used
            used.add((placement["node"], device))
    # Each node reports the tasks the workload placed on it.
    for name in nodes:
        node = api.admin.get(f"/nodes/{name}").json()
        mine = [t for t in node["tasks"] if t["workload"] == gang["name"]]
        expected = [p for p in placements if p["node"] == name]
        assert sorted(t["task"] for t in mine) == sorted(p["task"] for p in expected)
        assert node["allocated_gpu"] == sum(p["gpu"] for p in expected)
        assert all(t["project"] == project["name"] for t in mine)

    kinds = [event["kind"] for event in api.admin.get(f"/workloads/{gang['name']}/events").json()]
    assert kinds[:2] == ["submitted", "bound"]
    why = api.admin.get(f"/workloads/{gang['name']}/why").json()
    assert why["status"] == "running" and why["position"] is None


def test_fractions_share_a_device(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()
    node = api.node(pool, gpus=1)
    halves = [api.submit(project["name"], pool, gpu=0.5) for _ in range(2)]
    for half in halves:
        placement = api.wait_status(half["name"], "running")["placements"]
        assert placement == [{"task": 0, "node": node["name"], "devices": [0], "gpu": 0.5}]
    assert api.admin.get(f"/nodes/{node['name']}").json()["allocated_gpu"] == 1.0
    third = api.submit(project["name"], pool, gpu=0.5)
    api.wait_considered(third["name"])


def test_pending_work_explains_why(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()
    node = api.node(pool, gpus=2)
    holder = api.submit(project["name"], pool, gpu=2)
    api.wait_status(holder["name"], "running")
    first = api.submit(project["name"], pool, gpu=1)
    second = api.submit(project["name"], pool, gpu=1)
    for workload in (first, second):
        api.wait_considered(workload["name"])

    why = api.admin.get(f"/workloads/{first['name']}/why").json()
    assert why["status"] == "pending" and why["reason"]
    assert why["position"] == 1 and why["ahead"] == []
    assert why["holders"] == [
        {
            "workload": holder["name"],
            "project": project["name"],
            "priority": holder["priority"],
            "preemptible": True,
            "node": node["name"],
            "gpu": 2.0,
            "may_take": "no: same project, and its priority is not lower",
        }
    ]
    assert why["needs"] == 1 and why["preempt"].startswith("nothing to preempt")
    why = api.admin.get(f"/workloads/{second['name']}/why").json()
    assert why["position"] == 2 and why["ahead"] == [first["name"]]
    # Freeing the devices lets the first in line run.
    assert api.admin.delete(f"/workloads/{holder['name']}").status_code == 204
    api.wait_status(first["name"], "running")
    api.wait_status(second["name"], "running")


def test_suspend_and_resume(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()
    node = api.node(pool, gpus=1)
    workload = api.submit(project["name"], pool)
    name = workload["name"]
    api.wait_status(name, "running")

    response = api.admin.post(f"/workloads/{name}/suspend")
    assert response.status_code == 200, response.text
    suspended = response.json()
    assert suspended["status"] == "suspended" and suspended["placements"] == []
    assert api.admin.get(f"/nodes/{node['name']}").json()["tasks"] == []
    assert api.admin.post(f"/workloads/{name}/suspend").status_code == 409
    # Suspended work is not scheduled, even with the node free.
    other = api.submit(project["name"], pool)
    api.wait_status(other["name"], "running")
    assert api.admin.delete(f"/workloads/{other['name']}").status_code == 204

    response = api.admin.post(f"/workloads/{name}/resume")
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("pending", "running")
    resumed = api.wait_status(name, "running")
    assert resumed["attempts"] == 2
    assert api.admin.post(f"/workloads/{name}/resume").status_code == 409
    kinds = [event["kind"] for event in api.admin.get(f"/workloads/{name}/events").json()]
    assert kinds == ["submitted", "bound", "suspended", "resumed", "bound"]


def test_delete_workload_frees_its_devices(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()
    node = api.node(pool, gpus=1)
    first = api.submit(project["name"], pool)
    api.wait_status(first["name"], "running")
    waiting = api.submit(project["name"], pool)
    api.wait_considered(waiting["name"])
    assert api.admin.delete(f"/workloads/{first['name']}").status_code == 204
    assert api.admin.get(f"/workloads/{first['name']}").status_code == 404
    assert api.admin.delete(f"/workloads/{first['name']}").status_code == 404
    running = api.wait_status(waiting["name"], "running")
    assert running["placements"][0]["node"] == node["name"]
    assert first["name"] not in {w["name"] for w in api.admin.get("/workloads").json()}


# -- nodes --------------------------------------------------------------------------------


def test_node_register_list_get(api: Api) -> None:
    pool = unique("pool")
    node = api.node(
        pool, gpus=2, gpu_model="h100", gpu_memory="80GiB", cpu=32, memory="256GiB",
        labels={"rack": "r1"},
    )  # fmt: skip
    assert node["gpus"] == 2 and node["gpu_model"] == "h100"
    assert node["gpu_memory"] == 80 * GIB and node["memory"] == 256 * GIB and node["cpu"] == 32
    assert node["labels"] == {"pool": pool, "rack": "r1"}
    assert node["schedulable"] is True and node["state"] == "ready" and node["virtual"] is True
    assert [d["index"] for d in node["devices"]] == [0, 1]
    assert all(d["virtual"] and d["model"] == "h100" for d in node["devices"])
    assert node["tasks"] == [] and node["allocated_gpu"] == 0
    assert api.admin.get(f"/nodes/{node['name']}").json() == node
    assert node in api.admin.get("/nodes").json()

    response = api.admin.post("/nodes", json={"name": node["name"], "gpus": 8})
    assert response.status_code == 409, response.text
    assert api.admin.get(f"/nodes/{node['name']}").json()["gpus"] == 2

    devices = [{"index": i, "uuid": f"GPU-{i}", "model": "a100", "memory": "40GiB"} for i in (0, 1)]
    real = api.admin.post("/nodes", json={"name": unique("real"), "gpus": 2, "devices": devices})
    assert real.status_code == 201, real.text
    assert [d["uuid"] for d in real.json()["devices"]] == ["GPU-0", "GPU-1"]
    assert real.json()["virtual"] is False
    bad = api.admin.post("/nodes", json={"name": unique("bad"), "gpus": 3, "devices": devices})
    assert bad.status_code == 422, bad.text
    twice = [devices[0], devices[0]]
    bad = api.admin.post("/nodes", json={"name": unique("bad"), "gpus": 2, "devices": twice})
    assert bad.status_code == 422, bad.text

    missing = unique("gone")
    for method, path in (
        ("GET", f"/nodes/{missing}"),
        ("DELETE", f"/nodes/{missing}"),
        ("POST", f"/nodes/{missing}/cordon"),
        ("POST", f"/nodes/{missing}/uncordon"),
    ):
        response = api.admin.request(method, path)
        assert response.status_code == 404, (method, path, response.text)


def test_cordoned_node_gets_no_new_work(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()
    node = api.node(pool, gpus=4)
    before = api.submit(project["name"], pool)
    api.wait_status(before["name"], "running")

    response = api.admin.post(f"/nodes/{node['name']}/cordon")
    assert response.status_code == 200, response.text
    assert response.json()["schedulable"] is False
    assert api.admin.get(f"/nodes/{node['name']}").json()["schedulable"] is False
    after = api.submit(project["name"], pool)
    api.wait_considered(after["name"])
    # Work already there keeps running.
    assert api.workload(before["name"])["status"] == "running"
    assert [t["workload"] for t in api.admin.get(f"/nodes/{node['name']}").json()["tasks"]] == [
        before["name"]
    ]

    response = api.admin.post(f"/nodes/{node['name']}/uncordon")
    assert response.status_code == 200 and response.json()["schedulable"] is True
    assert api.wait_status(after["name"], "running")["placements"][0]["node"] == node["name"]


def test_removed_node_requeues_its_work(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()
    node = api.node(pool, gpus=2)
    gang = api.submit(project["name"], pool, replicas=2)
    api.wait_status(gang["name"], "running")

    assert api.admin.delete(f"/nodes/{node['name']}").status_code == 204
    assert api.admin.get(f"/nodes/{node['name']}").status_code == 404
    assert node["name"] not in {n["name"] for n in api.admin.get("/nodes").json()}
    requeued = api.workload(gang["name"])
    assert requeued["status"] == "pending" and requeued["placements"] == []
    events = api.admin.get(f"/workloads/{gang['name']}/events").json()
    assert [e["node"] for e in events if e["kind"] == "requeued"] == [node["name"]]

    replacement = api.node(pool, gpus=2)
    running = api.wait_status(gang["name"], "running")
    assert {p["node"] for p in running["placements"]} == {replacement["name"]}
    assert running["attempts"] == 2


# -- cluster, health, OpenAPI, limits -----------------------------------------------------


def test_cluster_summary_matches_nodes_and_workloads(live_server: Any) -> None:
    api = Api(live_server)
    try:
        empty = api.admin.get("/cluster").json()
        assert empty["nodes"] == 0 and empty["gpus"] == 0 and empty["queues"] == 0
        assert sum(empty["workloads"].values()) == 0

        pool = unique("pool")
        project = api.queue()
        api.node(pool, gpus=8)
        api.node(pool, gpus=4)
        cordoned = api.node(pool, gpus=2)
        api.admin.post(f"/nodes/{cordoned['name']}/cordon")
        big = api.submit(project["name"], pool, gpu=4, replicas=2)
        half = api.submit(project["name"], pool, gpu=0.5)
        # It fits only an empty 8-GPU node: it waits.
        too_big = api.submit(project["name"], pool, gpu=8)
        paused = api.submit(project["name"], pool, gpu=1)
        api.admin.post(f"/workloads/{paused['name']}/suspend")
        api.wait_status(big["name"], "running")
        api.wait_status(half["name"], "running")
        api.wait_considered(too_big["name"])

        summary = api.admin.get("/cluster").json()
        nodes = api.admin.get("/nodes").json()
        workloads = api.admin.get("/workloads").json()
        assert summary["nodes"] == len(nodes) == 3
        assert summary["nodes_ready"] == 3
        assert summary["gpus"] == sum(node["gpus"] for node in nodes) == 14
        assert summary["virtual_gpus"] == 14
        allocated = sum(node["allocated_gpu"] for node in nodes)
        assert summary["gpus_allocated"] == pytest.approx(allocated) == 8.5
        assert summary["gpus_free"] == pytest.approx(14 - 8.5)
        counts = {status: 0 for status in summary["workloads"]}
        for workload in workloads:
            counts[workload["status"]] += 1
        assert summary["workloads"] == counts
        assert counts == {
            "pending": 1,
            "running": 2,
            "suspended": 1,
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
        }
        assert summary["queues"] == 1
        assert summary["last_cycle_at"] is not None and summary["last_cycle_seconds"] >= 0
    finally:
        api.close()


def test_healthz(shared_server: Any) -> None:
    response = httpx.get(f"{shared_server.url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_openapi_document(shared_server: Any) -> None:
    response = httpx.get(f"{shared_server.api}/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    assert document["info"]["title"] == "corral"
    paths = document["paths"]
    expected = {
        "/api/v1/queues": {"get", "post"},
        "/api/v1/queues/{name}": {"get", "patch", "delete"},
        "/api/v1/workloads": {"get", "post"},
        "/api/v1/workloads/{name}": {"get", "delete"},
        "/api/v1/workloads/{name}/suspend": {"post"},
        "/api/v1/workloads/{name}/resume": {"post"},
        "/api/v1/workloads/{name}/events": {"get"},
        "/api/v1/workloads/{name}/why": {"get"},
        "/api/v1/nodes": {"get", "post"},
        "/api/v1/nodes/{name}": {"get", "delete"},
        "/api/v1/nodes/{name}/cordon": {"post"},
        "/api/v1/nodes/{name}/uncordon": {"post"},
        "/api/v1/cluster": {"get"},
        "/api/v1/users": {"get", "post"},
    }
    for path, methods in expected.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, set(paths[path]))
    schemas = document["components"]["schemas"]
    for name in ("QueueIn", "QueueOut", "WorkloadIn", "WorkloadOut", "NodeIn", "NodeOut"):
        assert name in schemas, name
    assert "required" in schemas["WorkloadIn"] and "project" in schemas["WorkloadIn"]["required"]
    assert any(
        s.get("scheme") == "bearer" for s in document["components"]["securitySchemes"].values()
    )
    for path, operations in paths.items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            assert "401" in operation["responses"], (method, path)
            if "requestBody" in operation:
                assert "422" in operation["responses"], (method, path)


def _big_workload(size: int) -> bytes:
    """A valid submission whose JSON is about `size` bytes long."""
    piece = 60_000
    command = ["x" * piece] * (size // piece)
    return json.dumps({"project": "p", "tasks": [{}], "command": command}).encode()


def test_body_over_1_mib_is_413(api: Api) -> None:
    project = api.queue()
    name = unique("huge")
    body = json.loads(_big_workload(1_100_000))
    body.update(project=project["name"], name=name)
    raw = json.dumps(body).encode()
    assert len(raw) > 1 << 20
    response = api.admin.post("/workloads", content=raw, headers=_JSON)
    assert response.status_code == 413, response.text
    assert "1 MiB" in response.json()["detail"]
    assert api.admin.get(f"/workloads/{name}").status_code == 404
    # Just under the limit is fine.
    body = json.loads(_big_workload(1_000_000))
    body.update(project=project["name"], name=name)
    raw = json.dumps(body).encode()
    assert len(raw) < 1 << 20
    response = api.admin.post("/workloads", content=raw, headers=_JSON)
    assert response.status_code == 201, response.text[:300]


def _chunks(raw: bytes) -> Iterator[bytes]:
    for start in range(0, len(raw), 64 * 1024):
        yield raw[start : start + 64 * 1024]


def test_streamed_body_over_1_mib_is_413(api: Api) -> None:
    """Without a Content-Length (chunked transfer), the limit holds all the same."""
    project = api.queue()
    name = unique("streamed")
    body = json.loads(_big_workload(1_100_000))
    body.update(project=project["name"], name=name)
    request = api.admin.build_request(
        "POST", "/workloads", content=_chunks(json.dumps(body).encode()), headers=_JSON
    )
    assert "content-length" not in request.headers
    response = api.admin.send(request)
    assert response.status_code == 413, response.text
    assert api.admin.get(f"/workloads/{name}").status_code == 404


def test_error_bodies_carry_no_traceback(api: Api) -> None:
    """A sample of every kind of error; `checked` clients assert on each body, and this
    also checks the shape: JSON with a `detail`."""
    queue = api.queue()
    anonymous = checked(httpx.Client(base_url=api.server.api, timeout=30))
    calls = [
        (api.admin, "GET", f"/queues/{unique('x')}", None),
        (api.admin, "POST", "/queues", {"name": queue["name"]}),
        (api.admin, "POST", "/queues", {"name": "@"}),
        (api.admin, "POST", "/workloads", {"project": unique("x"), "tasks": [{}]}),
        (api.admin, "POST", "/workloads", "[1, 2"),
        (api.admin, "POST", "/workloads", "\udcff".encode("utf-8", "surrogatepass")),
        (api.admin, "PUT", "/queues", None),
        (api.admin, "GET", "/no/such/path", None),
        (api.admin, "POST", "/workloads", b"x" * ((1 << 20) + 1)),
        (anonymous, "GET", "/workloads", None),
    ]
    try:
        for client, method, path, body in calls:
            if isinstance(body, str | bytes):
                response = client.request(method, path, content=body, headers=_JSON)
            else:
                response = client.request(method, path, json=body)
            assert response.status_code >= 400, (method, path)
            assert response.headers["content-type"].startswith("application/json"), response.text
            assert "detail" in response.json()
    finally:
        anonymous.close()


def test_whoami_and_users(api: Api) -> None:
    project = api.queue()
    assert api.admin.get("/whoami").json() == {
        "name": "admin",
        "role": "admin",
        "project": None,
        "projects": [],
        "unix_user": None,  # the first admin has no Unix account unless the operator names one
    }
    name = unique("someone")
    response = api.admin.post(
        "/users", json={"name": name, "role": "member", "project": project["name"]}
    )
    assert response.status_code == 201, response.text
    token = response.json()["token"]
    # `project` as before memberships, and the membership it made.
    user = {
        "name": name,
        "role": "member",
        "project": project["name"],
        "projects": [{"project": project["name"], "role": "member"}],
        "unix_user": name,  # by default, the account of the same name
    }
    with api.client(token) as client:
        assert client.get("/whoami").json() == user
    assert user in api.admin.get("/users").json()
    again = api.admin.post("/users", json={"name": name, "role": "viewer"})
    assert again.status_code == 409, again.text
    no_project = api.admin.post("/users", json={"name": unique("p"), "role": "member"})
    assert no_project.status_code == 422, no_project.text
    unknown_project = api.admin.post(
        "/users", json={"name": unique("p"), "role": "member", "project": unique("none")}
    )
    assert names_field(unknown_project, "project"), unknown_project.text
    second = api.admin.post(f"/users/{name}/tokens")
    assert second.status_code == 201 and second.json()["token"] != token
    with api.client(second.json()["token"]) as client:
        assert client.get("/whoami").json()["name"] == name
    assert api.admin.post(f"/users/{unique('nobody')}/tokens").status_code == 404


def test_a_nul_in_a_url_is_refused_by_name_on_every_backend(api: Api) -> None:
    """PostgreSQL cannot hold a NUL in text: a filter or name with one was a store error
    (500) there. It is bad input on every backend, refused before any handler."""
    for path, params, where in [
        ("/workloads", {"project": "team\x00"}, ["query", "project"]),
        ("/workloads", {"user": "\x00"}, ["query", "user"]),
        ("/queues/a%00b", {}, ["path"]),
        ("/workloads/x%00/logs", {"task": "0"}, ["path"]),
    ]:
        response = api.admin.get(path, params=params)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["detail"][0]["loc"] == where
    # Without one, the same filter answers.
    assert api.admin.get("/workloads", params={"project": "team"}).status_code == 200


def test_a_gang_that_waited_gets_a_reservation_and_short_work_backfills(api: Api) -> None:
    pool = unique("pool")
    project = api.queue(reserve_after=1)
    node = api.node(pool, gpus=2)
    holder = api.submit(project["name"], pool, gpu=1, max_runtime="1h")
    api.wait_status(holder["name"], "running")
    gang = api.submit(project["name"], pool, gpu=2)

    def reserved() -> dict[str, Any] | None:
        workload = api.workload(gang["name"])
        return workload if "reserved nodes" in (workload["reason"] or "") else None

    # Its wait is read afresh at the scheduler's next full read of the store.
    waiting = wait_for(reserved, "a reservation", timeout=60)
    assert f"reserved nodes {node['name']} from ~" in waiting["reason"]
    why = api.admin.get(f"/workloads/{gang['name']}/why").json()
    assert f"reserved nodes {node['name']}" in why["reason"]
    # Work that would outlast the reservation's start waits; work that ends before runs.
    long = api.submit(project["name"], pool, gpu=1, max_runtime="2h")
    short = api.submit(project["name"], pool, gpu=1, max_runtime="10m")
    api.wait_status(short["name"], "running")
    reason = api.wait_considered(long["name"])["reason"]
    assert reason.endswith(f"reserved for {gang['project']}/{gang['name']}: {node['name']}"), reason
