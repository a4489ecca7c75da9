"""Node pools in the store, on SQLite and PostgreSQL: a queue's quotas by pool and a
workload's pools are kept, reach the snapshot the server schedules from, and a bad pool
quota changes nothing. Also migration 0011_pools on a store of before."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from corral.engine import schedule
from corral.model import Node, PoolQuota, Queue, Resources, TaskGroup, gpu_quota
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.errors import Invalid
from migration_support import store_of_before

A100 = PoolQuota(gpu_quota(2), Resources(4, math.inf, 512 << 30))


def _node(name: str, pool: str | None) -> NodeSpec:
    labels = {"pool": pool} if pool else {}
    devices = tuple(Device(i, f"{name}-{i}", "virtual", 80 << 30, True) for i in range(2))
    return NodeSpec(Node(name, gpus=2, labels=labels), devices, virtual=True)


def test_pools_are_kept_and_scheduled(store: Store) -> None:
    store.register_node(_node("a0", "a100"))
    store.register_node(_node("n0", None))
    store.create_queue(Queue("q", deserved=gpu_quota(1), pools={"a100": A100}))
    spec = WorkloadSpec("w", "q", "alice", (TaskGroup("worker", 1, 1.0),), node_pools=("a100",))
    store.submit(spec)
    assert store.get_queue("q").queue.pools == {"a100": A100}
    assert store.get_workload("w").spec.node_pools == ("a100",)
    snapshot = store.snapshot()
    assert snapshot.queues[0].pools == {"a100": A100}
    assert snapshot.workloads[0].node_pools == ("a100",)
    assert [node.pool for node in sorted(snapshot.nodes, key=lambda n: n.name)] == [
        "a100",
        "default",
    ]
    decisions = schedule(snapshot)
    assert decisions.bindings["w"][0].node == "a0"
    # Replaced whole, and taken off again.
    store.update_queue("q", {"pools": {"v100": PoolQuota(gpu_quota(1))}}, None)
    assert set(store.get_queue("q").queue.pools) == {"v100"}
    store.update_queue("q", {"pools": {}}, None)
    assert store.get_queue("q").queue.pools == {}


def test_a_pool_limit_below_its_deserved_changes_nothing(store: Store) -> None:
    store.create_queue(Queue("q", pools={"a100": A100}))
    bad = {"a100": PoolQuota(gpu_quota(4), Resources(2, math.inf, math.inf))}
    with pytest.raises(Invalid) as raised:
        store.update_queue("q", {"pools": bad}, None)
    assert (*raised.value.at, raised.value.field) == ("pools", "a100", "limit", "gpu")
    assert store.get_queue("q").queue.pools == {"a100": A100}
    with pytest.raises(Invalid):
        store.create_queue(Queue("r", pools=bad))


def test_rows_of_before_have_no_pools(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = store_of_before(url, "0006_ux")
    try:
        assert store.get_queue("team").queue.pools == {}
        assert store.get_workload("old").spec.node_pools == ()
        snapshot = store.snapshot()
        assert snapshot.workloads[0].node_pools == ()
        assert snapshot.queues[0].pools == {}
    finally:
        store.close()
