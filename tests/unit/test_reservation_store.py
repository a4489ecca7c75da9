"""The snapshot the server schedules from carries what reservations need: each queue's
reserve_after, each workload's max runtime, and how long each pending workload has
waited since it last became pending; on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from pathlib import Path

from sqlalchemy import update

from corral.model import Decisions, Eviction, Node, Placement, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.schema import WorkloadRow
from migration_support import store_of_before


def test_snapshot_has_reserve_after_max_runtime_and_waiting_for(store: Store) -> None:
    store.register_node(
        NodeSpec(
            Node("n1", gpus=1),
            (Device(0, "v-0", "virtual", 80 << 30, True),),
            virtual=True,
        )
    )
    store.create_queue(Queue("dept", deserved=Resources(1.0, math.inf, math.inf)))
    store.create_queue(
        Queue("q", parent="dept", deserved=Resources(1.0, math.inf, math.inf), reserve_after=1800)
    )
    group = (TaskGroup("worker", 1, 1.0),)
    store.submit(WorkloadSpec("limited", "q", "alice", group, max_runtime=7200.0))
    store.submit(WorkloadSpec("open", "q", "alice", group))
    with store.write() as session:
        # Submitted two hours ago.
        session.execute(update(WorkloadRow).values(created_at=WorkloadRow.created_at - 7200))
    snapshot = store.snapshot()
    queues = {queue.name: queue for queue in snapshot.queues}
    assert (queues["dept"].reserve_after, queues["q"].reserve_after) == (None, 1800)
    workloads = {workload.name: workload for workload in snapshot.workloads}
    assert workloads["limited"].max_runtime == 7200
    assert workloads["open"].max_runtime is None
    assert 7200 <= (workloads["open"].waiting_for or 0) < 7300
    # Running, it has no wait; evicted, it waits anew from its requeue.
    store.apply(Decisions({"limited": (Placement(0, "n1", (0,), 1.0),)}, (), {}, {}))
    running = {w.name: w for w in store.snapshot().workloads}["limited"]
    assert running.waiting_for is None
    store.apply(Decisions({}, (Eviction("limited", (0,), "reclaim", "x", "test"),), {}, {}))
    requeued = {w.name: w for w in store.snapshot().workloads}["limited"]
    assert 0 <= (requeued.waiting_for or -1) < 100


def test_queues_of_before_do_not_reserve(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = store_of_before(url, "0003_memberships")
    try:
        assert store.get_queue("team").queue.reserve_after is None
        store.update_queue("team", {"reserve_after": 900.0}, None)
        assert store.get_queue("team").queue.reserve_after == 900.0
    finally:
        store.close()
