"""The never-fits check at submit, pool by pool (issue 41): a workload that names node pools
runs in one of them, so it is refused when it can never run in any, with a reason that
names them; it is accepted when one of them may hold it, or has no node yet (nodes may
join); a PATCH of its pools is checked alike. Through the API of a real application on
each backend, without a scheduler (the pending reason is pinned in
tests/unit/test_never_fits.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from corral.control.admission import Admission
from corral.model import Node, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.server.app import create_app
from corral.store import Invalid, Store

API = "/api/v1"
# Pool a100: two nodes of 4 GPUs; pool h100: one of 8.
NODES = (("a100-0", "a100", 4), ("a100-1", "a100", 4), ("h100-0", "h100", 8))


@pytest.fixture
def admin(store: Store) -> Iterator[TestClient]:
    store.create_queue(Queue("team", deserved=Resources(gpu=8)))
    token = store.ensure_admin()
    assert token is not None
    app = create_app(store, run_scheduler=False)
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        for name, pool, gpus in NODES:
            body = {"name": name, "gpus": gpus, "labels": {"pool": pool}}
            response = client.post(f"{API}/nodes", json=body)
            assert response.status_code == 201, response.text
        yield client


def node(name: str, pool: str, gpus: int) -> NodeSpec:
    """A node of `pool` with virtual devices, as the API registers one."""
    devices = tuple(Device(i, f"{name}-{i}", "virtual", 80 << 30, True) for i in range(gpus))
    return NodeSpec(Node(name, gpus=gpus, labels={"pool": pool}), devices, virtual=True)


def workload(gpu: float, replicas: int = 1, **fields: Any) -> dict[str, Any]:
    return {
        "project": "team",
        "tasks": [{"gpu": gpu, "replicas": replicas}],
        "command": ["true"],
        **fields,
    }


def refused(response: httpx.Response) -> tuple[str, str]:
    """The one problem of a 422: its field path (after `body`) and its message."""
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert len(detail) == 1, detail
    return ".".join(str(part) for part in detail[0]["loc"][1:]), detail[0]["msg"]


def stored(client: TestClient) -> list[Any]:
    return list(client.get(f"{API}/workloads", params={"project": "team"}).json())


def test_work_that_fits_none_of_its_pools_is_refused_naming_them(admin: TestClient) -> None:
    cases = [
        (
            workload(16, node_pools=["a100", "h100"]),
            "tasks.0.gpu",
            "no node of pool a100 or h100 has 16 GPUs; the largest has 8",
        ),
        # 8 GPUs exist, in a pool it does not name.
        (
            workload(8, node_pools=["a100"]),
            "tasks.0.gpu",
            "no node of pool a100 has 8 GPUs; the largest has 4",
        ),
        (
            workload(4, replicas=3, node_pools=["a100"]),
            "tasks",
            "the gang needs 12 GPUs at once (3 tasks); all the nodes of pool a100 have 8 GPUs "
            "together",
        ),
        (
            {**workload(1, node_pools=["h100", "a100"]), "tasks": [{"gpu": 1, "cpu": 4096}]},
            "tasks.0.cpu",
            "no node of pool h100 or a100 has 4096 CPU cores; the largest has 64",
        ),
        # 16 GPUs in the two pools together, but a gang runs in one pool: said pool by pool.
        (
            workload(4, replicas=3, node_pools=["a100", "h100"]),
            "tasks",
            "pool a100: the gang needs 12 GPUs at once (3 tasks); all the nodes of the pool "
            "have 8 GPUs together; pool h100: the gang needs 12 GPUs at once (3 tasks); all "
            "the nodes of the pool have 8 GPUs together",
        ),
    ]
    for request, field, message in cases:
        assert refused(admin.post(f"{API}/workloads", json=request)) == (field, message), request
    assert stored(admin) == []


def test_work_that_fits_one_of_its_pools_is_accepted(admin: TestClient) -> None:
    for request in (
        workload(8, node_pools=["a100", "h100"]),
        workload(8, node_pools=["h100"]),
        workload(4, replicas=2, node_pools=["a100"]),
        # Without pools, every node counts, as before.
        workload(8),
    ):
        response = admin.post(f"{API}/workloads", json=request)
        assert response.status_code == 201, response.text
        assert response.json()["status"] == "pending"


def test_a_pool_without_nodes_is_waited_for(admin: TestClient) -> None:
    # No node is in b200 yet: one may join, so the work is accepted and waits.
    for pools in (["b200"], ["a100", "b200"]):
        response = admin.post(f"{API}/workloads", json=workload(16, node_pools=pools))
        assert response.status_code == 201, response.text
        assert response.json()["node_pools"] == pools
    # Nor does a100 have a node its selector allows: the same rule as without pools.
    rack = workload(16, node_pools=["a100"], node_selector={"rack": "r1"})
    assert admin.post(f"{API}/workloads", json=rack).status_code == 201
    # Once a node joins b200, what it can never hold there is refused.
    node = {"name": "b200-0", "gpus": 8, "labels": {"pool": "b200"}}
    assert admin.post(f"{API}/nodes", json=node).status_code == 201
    assert refused(admin.post(f"{API}/workloads", json=workload(16, node_pools=["b200"]))) == (
        "tasks.0.gpu",
        "no node of pool b200 has 16 GPUs; the largest has 8",
    )


def test_a_change_of_pools_where_it_never_fits_is_refused_and_changes_nothing(
    admin: TestClient,
) -> None:
    made = admin.post(f"{API}/workloads", json=workload(8, node_pools=["h100"]))
    assert made.status_code == 201, made.text
    path = f"{API}/workloads/{made.json()['name']}"
    before = admin.get(path).json()
    assert refused(admin.patch(path, json={"node_pools": ["a100"]})) == (
        "tasks.0.gpu",
        "no node of pool a100 has 8 GPUs; the largest has 4",
    )
    assert admin.get(path).json() == before
    assert [event["kind"] for event in admin.get(f"{path}/events").json()] == ["submitted"]
    # A pool that may hold it, one with no node yet, or any pool: changed.
    for pools in (["a100", "h100"], ["b200"], []):
        changed = admin.patch(path, json={"node_pools": pools})
        assert changed.status_code == 200, changed.text
        assert changed.json()["node_pools"] == pools


def test_a_pool_limit_is_the_limit_where_it_runs(admin: TestClient) -> None:
    # Its own limit holds in the default pool; in h100 its pool's limit does.
    capped = {"name": "capped", "deserved": 2, "limit": 2, "pools": {"h100": {"limit": 4}}}
    assert admin.post(f"{API}/queues", json=capped).status_code == 201
    eight = {**workload(8), "project": "capped"}
    assert refused(admin.post(f"{API}/workloads", json={**eight, "node_pools": ["h100"]})) == (
        "tasks",
        "it needs 8 GPUs at once, more than project capped's limit of 4 GPUs in pool h100",
    )
    # a100 gives it no limit, but no node there holds 8 GPUs: said pool by pool.
    both = {**eight, "node_pools": ["h100", "a100"]}
    assert refused(admin.post(f"{API}/workloads", json=both)) == (
        "tasks",
        "pool h100: it needs 8 GPUs at once, more than project capped's limit of 4 GPUs; "
        "pool a100: no node of the pool has 8 GPUs; the largest has 4",
    )
    four = {**workload(4), "project": "capped", "node_pools": ["h100"]}
    assert admin.post(f"{API}/workloads", json=four).status_code == 201


def test_a_batch_names_the_item_that_fits_none_of_its_pools(admin: TestClient) -> None:
    batch = {"workloads": [workload(8, node_pools=["h100"]), workload(8, node_pools=["a100"])]}
    response = admin.post(f"{API}/workloads/batch", json=batch)
    assert refused(response) == (
        "workloads.1.tasks.0.gpu",
        "no node of pool a100 has 8 GPUs; the largest has 4",
    )
    assert stored(admin) == []


def test_a_pool_the_last_cycle_had_no_node_in_is_looked_up(store: Store) -> None:
    # The shape kept from the last cycle knows no node of h100: only the store tells that
    # the one there now is too small.
    store.register_node(node("a100-0", "a100", 4))
    store.create_queue(Queue("team", deserved=Resources(gpu=8)))
    kept = store.cluster_shape()
    store.register_node(node("h100-0", "h100", 8))
    admission = Admission(store, lambda: kept)
    spec = WorkloadSpec("w", "team", "u", (TaskGroup(gpu=16),), node_pools=("h100",))
    assert not admission.accepts(spec)
    with pytest.raises(Invalid) as problem:
        admission.check(spec)
    assert (problem.value.field, problem.value.message) == (
        "gpu",
        "no node of pool h100 has 16 GPUs; the largest has 8",
    )
