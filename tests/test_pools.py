"""Node pools: reading per-pool quotas and workload pools from scenario files, and the
engine's division of a cycle by pool (the behaviour itself is pinned by C80-C87)."""

import copy
import math
from typing import Any

import pytest
import yaml

from corral.engine import Scheduler, SnapshotError, schedule
from corral.engine.pools import pools_of, queues_in, uses_pools
from corral.model import (
    DEFAULT_POOL,
    Node,
    Placement,
    PoolQuota,
    Queue,
    Resources,
    Snapshot,
    TaskGroup,
    Workload,
    gpu_quota,
)
from corral.scenario import ScenarioError, parse_scenario

Document = dict[str, Any]


def base() -> Document:
    return {
        "name": "pools",
        "nodes": [
            {"name": "a0", "gpus": 2, "labels": {"pool": "a100"}},
            {"name": "n0", "gpus": 2},
        ],
        "queues": [
            {"name": "q", "deserved": 1, "pools": {"a100": {"deserved": 2, "limit": 4}}},
        ],
        "workloads": [{"name": "w", "queue": "q", "tasks": "1x1", "node_pools": ["a100"]}],
    }


def parse(document: Document) -> Any:
    return parse_scenario(yaml.safe_dump(document, sort_keys=False), "S.yaml")


def test_pools_are_read() -> None:
    scenario = parse(base())
    queue = scenario.snapshot.queues[0]
    assert queue.pools == {"a100": PoolQuota(gpu_quota(2), Resources(4, math.inf, math.inf))}
    assert queue.quota_in("a100").deserved.gpu == 2
    # The queue's own deserved and limit are its quota in the default pool.
    assert queue.quota_in(DEFAULT_POOL) == PoolQuota(gpu_quota(1), queue.limit)
    assert queue.quota_in("v100") == PoolQuota()
    assert scenario.snapshot.workloads[0].node_pools == ("a100",)
    assert [node.pool for node in scenario.snapshot.nodes] == ["a100", DEFAULT_POOL]


def _set(document: Document, path: str, value: object) -> None:
    *parents, last = path.split(".")
    target: Any = document
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    target[last] = value


@pytest.mark.parametrize(
    ("path", "value", "field", "problem"),
    [
        ("queues.0.pools", [1], "queues[0].pools", "must be a mapping of pool to quota"),
        ("queues.0.pools", {"a100": 2}, "queues[0].pools.a100", "must be a mapping"),
        (
            "queues.0.pools",
            {"a100": {"deserved": 2, "weight": 1}},
            "queues[0].pools.a100.weight",
            "unknown field",
        ),
        (
            "queues.0.pools",
            {"a100": {"deserved": "lots"}},
            "queues[0].pools.a100.deserved",
            "must be a number of GPUs",
        ),
        (
            "queues.0.pools",
            {"a100": {"deserved": 4, "limit": 2}},
            "queues[0].pools.a100.limit",
            "gpu limit 2 is below deserved 4",
        ),
        (
            "queues.0.pools",
            {"default": {"deserved": 2}},
            "queues[0].pools.default",
            "the queue's own deserved and limit",
        ),
        ("workloads.0.node_pools", [], "workloads[0].node_pools", "an empty list"),
        ("workloads.0.node_pools", "a100", "workloads[0].node_pools", "must be a list"),
        ("workloads.0.node_pools", ["a100", "a100"], "workloads[0].node_pools[1]", "twice"),
        ("workloads.0.node_pools", [{"x": 1}], "workloads[0].node_pools[0]", "must be a string"),
    ],
)
def test_invalid_pools(path: str, value: object, field: str, problem: str) -> None:
    document = copy.deepcopy(base())
    _set(document, path, value)
    with pytest.raises(ScenarioError) as raised:
        parse(document)
    assert raised.value.path == field, str(raised.value)
    assert problem in str(raised.value)


def _snapshot(node_pools: tuple[str, ...] = (), pools: bool = False) -> Snapshot:
    nodes = (
        Node("a0", gpus=2, labels={"pool": "a100"}),
        Node("n0", gpus=2),
    )
    queue = Queue("q", deserved=gpu_quota(1))
    if pools:
        queue = Queue("q", deserved=gpu_quota(1), pools={"a100": PoolQuota(gpu_quota(2))})
    workloads = tuple(
        Workload(f"w{i}", "q", (TaskGroup(gpu=1),), submitted=i, node_pools=node_pools)
        for i in range(3)
    )
    return Snapshot(nodes, (queue,), workloads)


def test_a_pool_label_alone_does_not_divide_the_cluster() -> None:
    # Node labels named `pool` were used by node selectors before pools existed: only
    # queues' per-pool quotas or workloads' node_pools turn pools on.
    snapshot = _snapshot()
    assert not uses_pools(snapshot)
    decisions = schedule(snapshot)
    assert decisions.pools == {}
    assert len(decisions.bindings) == 3


def test_pools_of_and_queues_in() -> None:
    snapshot = _snapshot(pools=True)
    assert list(pools_of(snapshot.nodes)) == [DEFAULT_POOL, "a100"]
    (in_a100,) = queues_in(snapshot.queues, "a100")
    (in_default,) = queues_in(snapshot.queues, DEFAULT_POOL)
    assert (in_a100.deserved.gpu, in_default.deserved.gpu) == (2, 1)
    assert in_a100.pools == {}


def test_workloads_without_node_pools_try_the_default_pool_first() -> None:
    decisions = schedule(_snapshot(pools=True))
    nodes = [decisions.bindings[f"w{i}"][0].node for i in range(3)]
    assert nodes == ["n0", "n0", "a0"]
    assert decisions.queues["q"].allocated.gpu == 3
    assert decisions.pools["a100"]["q"].allocated.gpu == 1
    assert decisions.pools[DEFAULT_POOL]["q"].deserved.gpu == 1


def test_a_pending_workload_says_why_in_each_pool() -> None:
    snapshot = _snapshot(node_pools=("a100", "h100"), pools=True)
    decisions = schedule(snapshot)
    assert sorted(decisions.bindings) == ["w0", "w1"]
    reason = decisions.pending["w2"]
    assert reason.startswith("pool a100: needs 1 GPU; the pool has 0 GPUs free"), reason
    assert reason.endswith("; pool h100: no node in pool h100"), reason


def test_the_kept_scheduler_decides_as_schedule_does_with_pools() -> None:
    snapshot = _snapshot(node_pools=("a100",), pools=True)
    scheduler = Scheduler()
    assert scheduler(snapshot) == schedule(snapshot)
    assert scheduler(snapshot) == schedule(snapshot)


def test_work_with_tasks_in_two_pools_holds_its_devices_in_both() -> None:
    # A label changed under running work: its tasks are in a100 and in the default pool.
    snapshot = _snapshot(pools=True)
    spanning = Workload(
        "span",
        "q",
        (TaskGroup(replicas=2, gpu=2),),
        submitted=-1,
        placements=(Placement(0, "a0", (0, 1), 2.0), Placement(1, "n0", (0, 1), 2.0)),
    )
    snapshot = Snapshot(snapshot.nodes, snapshot.queues, (spanning, *snapshot.workloads))
    decisions = schedule(snapshot)
    # Every GPU is held: nothing else starts, and the spanning work stays, counted once.
    assert decisions.bindings == {}
    assert decisions.evictions == ()
    assert decisions.queues["q"].allocated.gpu == 4
    assert decisions.pools["a100"]["q"].allocated.gpu == 2


def test_work_with_tasks_in_two_pools_is_evicted_whole() -> None:
    nodes = (Node("a0", gpus=2, labels={"pool": "a100"}), Node("n0", gpus=2))
    queues = (Queue("lender"), Queue("owner", pools={"a100": PoolQuota(gpu_quota(2))}))
    spanning = Workload(
        "span",
        "lender",
        (TaskGroup(replicas=2, gpu=2),),
        placements=(Placement(0, "a0", (0, 1), 2.0), Placement(1, "n0", (0, 1), 2.0)),
    )
    owed = Workload("owed", "owner", (TaskGroup(gpu=2),), submitted=1, node_pools=("a100",))
    decisions = schedule(Snapshot(nodes, queues, (spanning, owed)))
    [eviction] = decisions.evictions
    assert (eviction.workload, eviction.tasks, eviction.action) == ("span", (0, 1), "reclaim")
    assert decisions.bindings["owed"][0].node == "a0"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("twice", "workload w0: listed twice"),
        ("node", "workload w0: unknown node 'gone'"),
        ("queue", "workload w0: 'nowhere' is not a leaf queue"),
    ],
)
def test_bad_snapshots_are_refused_with_pools(change: str, message: str) -> None:
    snapshot = _snapshot(node_pools=("h100",), pools=True)
    first = snapshot.workloads[0]
    if change == "twice":
        workloads = (first, *snapshot.workloads)
    elif change == "node":
        placed = Workload(
            "w0", "q", first.task_groups, placements=(Placement(0, "gone", (0,), 1.0),)
        )
        workloads = (placed, *snapshot.workloads[1:])
    else:
        workloads = (Workload("w0", "nowhere", first.task_groups), *snapshot.workloads[1:])
    with pytest.raises(SnapshotError, match=message):
        schedule(Snapshot(snapshot.nodes, snapshot.queues, workloads))
