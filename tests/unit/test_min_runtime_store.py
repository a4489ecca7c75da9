"""The snapshot the server schedules from says how long each running workload has run
since its tasks were bound (for min-runtime), on SQLite and PostgreSQL."""

from __future__ import annotations

import math

from sqlalchemy import update

from corral.model import Decisions, Eviction, Node, Placement, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.schema import PlacementRow


def test_running_for_counts_from_the_latest_binding(store: Store) -> None:
    store.register_node(
        NodeSpec(
            Node("n1", gpus=2),
            tuple(Device(i, f"v-{i}", "virtual", 80 << 30, True) for i in range(2)),
            virtual=True,
        )
    )
    store.create_queue(
        Queue("q", deserved=Resources(2.0, math.inf, math.inf), reclaim_min_runtime=600.0)
    )
    for name in ("old", "waiting"):
        store.submit(WorkloadSpec(name, "q", "alice", (TaskGroup("worker", 1, 1.0),)))
    store.apply(Decisions({"old": (Placement(0, "n1", (0,), 1.0),)}, (), {}, {}))
    with store.write() as session:
        # Bound an hour ago.
        session.execute(update(PlacementRow).values(created_at=PlacementRow.created_at - 3600))
    snapshot = store.snapshot()
    workloads = {workload.name: workload for workload in snapshot.workloads}
    assert workloads["waiting"].running_for is None
    assert 3600 <= (workloads["old"].running_for or 0) < 3700
    assert snapshot.queues[0].reclaim_min_runtime == 600.0
    # Evicted and bound again: it starts anew.
    store.apply(Decisions({}, (Eviction("old", (0,), "reclaim", "x", "test"),), {}, {}))
    store.apply(Decisions({"old": (Placement(0, "n1", (1,), 1.0),)}, (), {}, {}))
    workloads = {workload.name: workload for workload in store.snapshot().workloads}
    assert 0 <= (workloads["old"].running_for or -1) < 100
