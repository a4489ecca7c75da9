"""Honest refusals: what can never run on the cluster is refused at submit with the reason
(corral.control.admission); what may run once nodes join is accepted and waits."""

from __future__ import annotations

import math

import httpx
from server_support import Api, unique

from corral.engine.admission import never_fits
from corral.model import Node, Queue, Resources, TaskGroup
from corral.model.spec import WorkloadSpec

GIB = 1024**3


def refused(response: httpx.Response) -> tuple[str, str]:
    """The one problem of a 422: its field path and its message."""
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert len(detail) == 1, detail
    return ".".join(str(part) for part in detail[0]["loc"][1:]), detail[0]["msg"]


def body(project: str, pool: str, gpu: float, replicas: int = 1, **fields: object) -> dict:
    return {
        "project": project,
        "tasks": [{"gpu": gpu, "replicas": replicas}],
        "node_selector": {"pool": pool},
        "command": ["true"],
        **fields,
    }


def test_never_fitting_work_is_refused_with_the_reason(api: Api) -> None:
    project = api.queue("adm")["name"]
    pool = unique("pool")
    api.node(pool, gpus=4)
    api.node(pool, gpus=2)
    before = api.admin.get("/workloads", params={"project": project}).json()
    where = "matching its node selector "
    cases = [
        (
            body(project, pool, 16),
            "tasks.0.gpu",
            f"no node {where}has 16 GPUs; the largest has 4",
        ),
        (
            body(project, pool, 4, replicas=2),
            "tasks",
            f"the gang needs 8 GPUs at once (2 tasks); all the nodes {where}have 6 GPUs together",
        ),
        (
            body(project, pool, 3, replicas=2),
            "tasks",
            f"the gang needs 2 tasks of 3 GPUs at once; the nodes {where}can hold 1 such tasks",
        ),
        (
            {**body(project, pool, 1), "tasks": [{"gpu": 0, "gpu_memory": "100GiB"}]},
            "tasks.0.gpu_memory",
            f"no GPU {where}has 100GiB of memory; the largest has 80GiB",
        ),
        (
            {**body(project, pool, 1), "tasks": [{"gpu": 1, "cpu": 4096}]},
            "tasks.0.cpu",
            f"no node {where}has 4096 CPU cores; the largest has",
        ),
    ]
    for request, field, message in cases:
        where_, text = refused(api.admin.post("/workloads", json=request))
        assert (where_, text[: len(message)]) == (field, message), request
    # Nothing was stored.
    assert api.admin.get("/workloads", params={"project": project}).json() == before
    # What fits the largest node, or the pool as an elastic minimum, is accepted.
    api.submit(project, pool, gpu=4)
    api.submit(project, pool, gpu=2, replicas=4, min_available=3)


def test_a_limit_refuses_a_gang_larger_than_it(api: Api) -> None:
    department = api.queue("admdept", deserved=4, limit=6)["name"]
    project = api.queue("adm", parent=department, deserved=2)["name"]
    pool = unique("pool")
    api.node(pool, gpus=8)
    field, message = refused(api.admin.post("/workloads", json=body(project, pool, 1, 8)))
    assert (field, message) == (
        "tasks",
        f"it needs 8 GPUs at once, more than department {department}'s limit of 6 GPUs",
    )
    limited = api.queue("adm", deserved=1, limit=2)["name"]
    request = body(limited, pool, 1, 4, min_available=3)
    assert refused(api.admin.post("/workloads", json=request)) == (
        "tasks",
        f"its minimum needs 3 GPUs at once, more than project {limited}'s limit of 2 GPUs",
    )
    # In a batch, the refused one is named by its place and nothing is stored.
    batch = {"workloads": [body(limited, pool, 1), body(limited, pool, 3)]}
    response = api.admin.post("/workloads/batch", json=batch)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][1:] == ["workloads", 1, "tasks"]
    assert api.admin.get("/workloads", params={"project": limited}).json() == []


def test_work_for_nodes_not_there_yet_is_accepted_and_says_why(api: Api) -> None:
    project = api.queue("adm")["name"]
    pool = unique("pool")
    waiting = api.submit(project, pool, gpu=16)
    assert waiting["status"] == "pending"
    reason = api.wait_considered(waiting["name"])["reason"]
    assert reason == "no schedulable node in the cluster" or "no node" in reason, reason
    # Once a node of that pool joins, a task larger than it is refused.
    api.node(pool, gpus=4)
    field, message = refused(api.admin.post("/workloads", json=body(project, pool, 16)))
    assert field == "tasks.0.gpu" and message.endswith("the largest has 4")


def test_never_fits_names_the_largest_node_without_a_selector() -> None:
    nodes = [Node("a", gpus=4), Node("b", gpus=2), Node("c", gpus=0)]
    queues = [Queue("team", deserved=Resources(2, math.inf, math.inf))]

    def spec(*groups: TaskGroup, **fields: object) -> WorkloadSpec:
        return WorkloadSpec("w", "team", "u", tuple(groups), **fields)  # type: ignore[arg-type]

    assert never_fits(spec(TaskGroup(gpu=16)), nodes, queues) == (
        ("tasks", 0, "gpu"),
        "no node has 16 GPUs; the largest has 4",
    )
    assert never_fits(spec(TaskGroup(gpu=4)), nodes, queues) is None
    assert never_fits(spec(TaskGroup(gpu=1), TaskGroup(name="b", gpu=8)), nodes, queues) == (
        ("tasks", 1, "gpu"),
        "no node has 8 GPUs; the largest has 4",
    )
    # No node at all: nodes may join, so it waits.
    assert never_fits(spec(TaskGroup(gpu=16)), [], queues) is None
    # A fraction needs a node with a GPU.
    assert never_fits(spec(TaskGroup(gpu=0.5)), [Node("c")], queues) == (
        ("tasks", 0, "gpu"),
        "no node has a GPU",
    )
