"""Workspaces in the store, on SQLite and PostgreSQL: declared ports and the numbers agents
report, the proxy's last activity, which keeps a workspace from counting as idle, and
migration 0006_ws on a store of 0003_memberships."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import update

from corral.model import Decisions, Node, Placement, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, PortSpec, WorkloadSpec
from corral.model.telemetry import Sample
from corral.store import Store
from corral.store.rules import enforce_rules, set_rules
from corral.store.telemetry import record_samples
from corral.store.telemetry_schema import AllocationRow
from migration_support import migrated

GIB = 1 << 30
PORTS = (PortSpec("main", base_url=True), PortSpec("tensorboard"))


def workspace(store: Store, name: str, ports: tuple[PortSpec, ...] = PORTS) -> None:
    store.submit(
        WorkloadSpec(
            name, "team", "alice", (TaskGroup("worker", 1, 1.0),), priority=100, ports=ports
        )
    )


@pytest.fixture
def cluster(store: Store) -> Store:
    store.register_node(
        NodeSpec(
            Node("n1", gpus=2),
            tuple(Device(i, f"v-{i}", "virtual", 80 * GIB, True) for i in range(2)),
            virtual=True,
        )
    )
    store.create_queue(Queue("team", deserved=Resources(2.0, math.inf, math.inf)))
    return store


def test_ports_are_kept_and_the_reported_numbers_found(cluster: Store) -> None:
    store = cluster
    workspace(store, "nb")
    assert store.get_workload("nb").spec.ports == PORTS
    pending = store.workspace_target("nb")
    assert (pending.status, pending.node, pending.numbers) == ("pending", None, {})
    # Not bound: a report of its ports changes nothing.
    assert not store.task_ports("nb", 0, {"main": 4000})
    store.apply(Decisions({"nb": (Placement(0, "n1", (0,), 1.0),)}, (), {}, {}))
    assert store.task_ports("nb", 0, {"main": 4000, "tensorboard": 4001})
    store.task_started("nb", 0, 123, 456)
    found = store.workspace_target("nb")
    assert (found.project, found.user, found.status, found.state) == (
        "team",
        "alice",
        "running",
        "running",
    )
    assert (found.node, found.address) == ("n1", "127.0.0.1")
    assert found.numbers == {"main": 4000, "tensorboard": 4001}
    assert found.ports == PORTS
    assert store.active_at(["nb"]) == {}
    store.mark_active(["nb"], 1234.5)
    assert store.active_at(["nb", "other"]) == {"nb": 1234.5}


def quiet(workload: str, seconds: float, now: float) -> list[Sample]:
    """GPU samples at 0% over the last `seconds`."""
    return [
        Sample(
            time=now - seconds + i * 5,
            node="n1",
            device=0 if workload == "busy" else 1,
            workload=workload,
            task=0,
            utilization=0,
            memory_used=GIB,
            memory_total=80 * GIB,
            power=None,
            temperature=None,
            source="declared",
            share=1.0,
            seconds=5,
        )
        for i in range(int(seconds // 5) + 1)
    ]


def test_proxy_traffic_keeps_a_workspace_from_being_idle(cluster: Store) -> None:
    store = cluster
    set_rules(store, "team", {"build": {"idle_timeout": "10m"}})
    workspace(store, "busy")
    workspace(store, "left")
    store.apply(
        Decisions(
            {"busy": (Placement(0, "n1", (0,), 1.0),), "left": (Placement(0, "n1", (1,), 1.0),)},
            (),
            {},
            {},
        )
    )
    with store.write() as session:
        session.execute(update(AllocationRow).values(start=time.time() - 4000))
    now = time.time()
    for name in ("busy", "left"):
        record_samples(store, quiet(name, 700, now))
    # Someone used the notebook through the proxy two minutes ago; the other one, never.
    store.mark_active(["busy"], now - 120)
    done = [item.record.name for item in enforce_rules(store, now)]
    assert done == ["left"]
    assert store.get_workload("busy").status == "running"
    assert store.get_workload("left").status == "suspended"
    # Traffic older than the idle timeout does not keep it.
    store.mark_active(["busy"], now - 650)
    assert [item.record.name for item in enforce_rules(store, now)] == ["busy"]


def test_migration_0006_ws_keeps_older_workloads(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "postgresql":
        url = "postgresql+psycopg://" + request.getfixturevalue("postgres")().split("://", 1)[1]
    else:
        url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = migrated(url, "0003_memberships")
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO queues (name, parent_id, deserved_gpu, weight_gpu, weight_cpu,"
                " weight_memory, priority, created_at) VALUES ('team', NULL, 4, 1, 1, 1,"
                " 100, 0)"
            )
        )
        connection.execute(
            sa.text(
                'INSERT INTO workloads (name, queue_id, "user", priority, preemptible,'
                " node_selector, topology_required, command, env, backoff_limit, grace_period,"
                " status, attempts, failures, created_at) VALUES ('old',"
                " (SELECT id FROM queues WHERE name = 'team'), 'alice', 50,"
                " true, '{}', true, '[]', '{}', 0, 30, 'pending', 0, 0, 100)"
            )
        )
    engine.dispose()
    store = Store(url)
    try:
        assert store.get_workload("old").spec.ports == ()
        target = store.workspace_target("old")
        assert (target.ports, target.active_at, target.numbers) == ((), None, {})
        workspace(store, "new")
        assert store.get_workload("new").spec.ports == PORTS
    finally:
        store.close()
