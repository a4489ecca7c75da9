"""Node pools through the REST API of a real server, on SQLite and on PostgreSQL: quotas by
pool on queues, `node_pools` on workloads, each node's pool, and `why` by pool.

Pools turn on for the whole cluster as soon as one queue or workload names one, so these
tests run on a server of their own (`live_server`), not the shared one.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from server_support import Api, locs, unique, wait_for

_JSON = {"content-type": "application/json"}


def _names(response: httpx.Response, *path: Any) -> bool:
    """A 422 naming the field `path` (dotted or split)."""
    wanted = ("body", *path)
    for loc in locs(response):
        flat: list[Any] = []
        for part in loc:
            flat.extend(part.split(".") if isinstance(part, str) else [part])
        if tuple(flat[: len(wanted)]) == wanted:
            return True
    return False


def test_pools_through_the_api(live_server: Any) -> None:
    api = Api(live_server)
    try:
        a100 = api.node("a100", gpus=2)
        plain = api.node("x", gpus=2, labels={"pool": ""})
        nodes = {node["name"]: node for node in api.admin.get("/nodes").json()}
        assert nodes[a100["name"]]["pool"] == "a100"
        # An empty label is no pool: the node is in the default pool.
        assert nodes[plain["name"]]["pool"] == "default"

        queue = api.queue(deserved=1, pools={"a100": {"deserved": 2, "limit": {"gpu": 2}}})
        pools = queue["pools"]
        assert pools["a100"]["deserved"]["gpu"] == 2 and pools["a100"]["limit"]["gpu"] == 2
        assert pools["a100"]["own_quota"] is True
        path = f"/queues/{queue['name']}"
        response = api.admin.patch(path, json={"pools": {"a100": {"deserved": 1}}})
        assert response.status_code == 200, response.text
        assert response.json()["pools"]["a100"]["limit"]["gpu"] is None

        first = api.submit(queue["name"], "a100", node_pools=["a100"], node_selector={})
        api.wait_status(first["name"], "running")
        assert api.workload(first["name"])["node_pools"] == ["a100"]
        assert api.workload(first["name"])["placements"][0]["node"] == a100["name"]

        # A pool no node is in is accepted (nodes come and go), and `why` says so.
        nowhere = api.submit(queue["name"], "h100", node_pools=["h100"], node_selector={})
        waiting = api.wait_considered(nowhere["name"])
        assert waiting["reason"] == "pool h100: no node in pool h100", waiting
        why = api.admin.get(f"/workloads/{nowhere['name']}/why").json()
        assert why["reason"] == "pool h100: no node in pool h100"

        # Pending, its pools change: listed twice is 422 naming the field, and nothing
        # changes; moved to a pool with room, it starts there.
        where = f"/workloads/{nowhere['name']}"
        twice = api.admin.patch(where, json={"node_pools": ["a100", "a100"]})
        assert twice.status_code == 422 and _names(twice, "node_pools"), twice.text
        assert api.workload(nowhere["name"])["node_pools"] == ["h100"]
        moved = api.admin.patch(where, json={"node_pools": ["a100"]})
        assert moved.status_code == 200, moved.text
        assert moved.json()["node_pools"] == ["a100"]
        api.wait_status(nowhere["name"], "running")
        assert api.workload(nowhere["name"])["placements"][0]["node"] == a100["name"]
        # Running, it keeps its pools.
        late = api.admin.patch(where, json={"node_pools": []})
        assert late.status_code == 409, late.text

        # The latest cycle's share in each pool.
        def divided() -> dict[str, Any] | None:
            shown = api.admin.get(path).json()["pools"]
            allocated = shown.get("a100", {}).get("allocated") or {}
            return shown if allocated.get("gpu") == 2 else None

        shown = wait_for(divided, "the queue's share by pool")
        assert shown["a100"]["allocated"]["gpu"] == 2  # the first and the one moved there
        assert shown["default"]["own_quota"] is False
        assert shown["default"]["deserved"]["gpu"] == 1
    finally:
        api.close()


def test_bad_pools_are_refused_and_change_nothing(live_server: Any) -> None:
    api = Api(live_server)
    try:
        for body, field in (
            ({"pools": {"default": {"deserved": 1}}}, ("pools",)),
            ({"pools": {"a100": 3}}, ("pools", "a100")),
            ({"pools": {"a100": {"deserved": -1}}}, ("pools", "a100", "deserved")),
            ({"pools": {"a100": {"deserved": 1, "weight": 2}}}, ("pools", "a100", "weight")),
            ({"pools": {"a100": {"deserved": 4, "limit": 2}}}, ("pools", "a100", "limit")),
            ({"pools": [1]}, ("pools",)),
        ):
            name = unique("bad")
            response = api.admin.post(
                "/queues", content=json.dumps({"name": name, **body}), headers=_JSON
            )
            assert response.status_code == 422 and _names(response, *field), response.text
            assert api.admin.get(f"/queues/{name}").status_code == 404
            queue = api.queue(pools={"a100": {"deserved": 1}})
            path = f"/queues/{queue['name']}"
            response = api.admin.patch(path, content=json.dumps(body), headers=_JSON)
            assert response.status_code == 422 and _names(response, *field), response.text
            assert api.admin.get(path).json()["pools"] == queue["pools"]

        project = api.queue()
        for node_pools, field in (
            (["a100", "a100"], ("node_pools",)),
            ([""], ("node_pools", 0)),
            ("a100", ("node_pools",)),
            ([f"p{i}" for i in range(17)], ("node_pools",)),
        ):
            body = {"project": project["name"], "tasks": [{"gpu": 1}], "node_pools": node_pools}
            response = api.admin.post("/workloads", json=body)
            assert response.status_code == 422 and _names(response, *field), response.text
        assert api.admin.get("/workloads").json() == []
    finally:
        api.close()
