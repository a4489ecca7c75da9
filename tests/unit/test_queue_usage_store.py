"""Time-decayed fair share on the server's side, on SQLite and PostgreSQL: the usage
history the scheduler loop keeps in the store, and a queue whose usage grows getting a
smaller share of the surplus."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from corral.control.scheduler import SchedulerLoop
from corral.engine.explain import weight_reason
from corral.model import Node, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.model.usage import DecayedUsage, advance, decay_settings
from corral.store import Store
from corral.store.errors import NotFound
from corral.store.schema import QueueUsageRow
from migration_support import store_of_before

HOUR = 3600.0


def _node(store: Store, gpus: int) -> None:
    devices = tuple(Device(i, f"v-{i}", "virtual", 80 << 30, True) for i in range(gpus))
    store.register_node(NodeSpec(Node("n1", gpus=gpus), devices, virtual=True))


def _queue(name: str, half_life: float | None = HOUR, **fields: object) -> Queue:
    return Queue(
        name,
        deserved=Resources(0.0, math.inf, math.inf),
        fair_share_half_life=half_life,
        **fields,  # type: ignore[arg-type]
    )


def _submit(store: Store, queue: str, names: list[str]) -> None:
    for name in names:
        store.submit(WorkloadSpec(name, queue, "alice", (TaskGroup("worker", 1, 1.0),)))


def _rows(store: Store) -> int:
    with store.read() as session:
        return int(session.scalar(select(func.count()).select_from(QueueUsageRow)) or 0)


def test_settings_are_stored_and_read_back(store: Store) -> None:
    store.create_queue(_queue("dept", half_life=2 * HOUR, fair_share_k=0.5))
    store.create_queue(_queue("team", half_life=None, parent="dept"))
    dept, team = (store.get_queue(name).queue for name in ("dept", "team"))
    assert (dept.fair_share_half_life, dept.fair_share_k) == (2 * HOUR, 0.5)
    assert (team.fair_share_half_life, team.fair_share_k) == (None, None)
    store.update_queue("team", {"fair_share_k": 3.0}, None)
    assert store.get_queue("team").queue.fair_share_k == 3.0


def test_usage_follows_what_is_bound(store: Store) -> None:
    _node(store, 4)
    store.create_queue(_queue("a"))
    store.create_queue(_queue("b"))
    store.create_queue(_queue("off", half_life=None))
    _submit(store, "a", ["a1", "a2", "a3"])
    _submit(store, "b", ["b1"])
    loop = SchedulerLoop(store)
    # The loop starts each queue's history (nothing bound yet), then binds all four.
    loop.run_cycle()
    assert loop.usage == {"a": 0.0, "b": 0.0}
    with store.write() as session:
        start = session.scalar(select(func.min(QueueUsageRow.updated_at)))
        # With nothing held yet, as if the history had started an hour earlier.
        session.execute(update(QueueUsageRow).values(updated_at=QueueUsageRow.updated_at - HOUR))
    assert start is not None
    shares = store.advance_usage(start)
    # The same by hand: 3 of the 4 GPUs held for an hour.
    a = advance(DecayedUsage(), 3.0, 4.0, HOUR, HOUR)
    assert shares["a"] == pytest.approx(a.share) == pytest.approx(0.75)
    assert shares["b"] == pytest.approx(0.25)
    with store.read() as session:
        row = session.scalars(select(QueueUsageRow).order_by(QueueUsageRow.queue_id)).first()
        assert row is not None and row.gpu_seconds == pytest.approx(a.gpu_seconds)
    assert "off" not in shares
    assert store.usage_shares() == pytest.approx(shares)
    # A clock that goes back adds nothing.
    assert store.advance_usage(start - 60) == pytest.approx(shares)
    # Turned off, a queue's history goes.
    store.update_queue("b", {"fair_share_half_life": None}, None)
    assert set(store.advance_usage(start + HOUR)) == {"a"}
    assert _rows(store) == 1


def test_a_deleted_queue_takes_its_usage_with_it(store: Store) -> None:
    store.create_queue(_queue("a"))
    store.advance_usage(1000.0)
    assert _rows(store) == 1
    store.delete_queue("a")
    assert _rows(store) == 0
    with pytest.raises(NotFound):
        store.get_queue("a")


def test_usage_accumulates_and_lowers_a_queues_share(store: Store) -> None:
    """a has the idle cluster to itself; then b arrives, and both want everything. With
    equal weights, a's usage makes the cycle give b the larger fair share."""
    _node(store, 8)
    store.create_queue(_queue("a"))
    store.create_queue(_queue("b"))
    _submit(store, "a", [f"a{i}" for i in range(8)])
    loop = SchedulerLoop(store)
    loop.usage_seconds = 0.0
    loop.run_cycle()
    with store.write() as session:
        # a's usage as if it had held its 8 GPUs for a half-life already.
        session.execute(update(QueueUsageRow).values(updated_at=QueueUsageRow.updated_at - HOUR))
    _submit(store, "a", [f"a{i}" for i in range(8, 12)])
    _submit(store, "b", [f"b{i}" for i in range(8)])
    decisions = loop.run_cycle()
    assert loop.usage["a"] == pytest.approx(1.0)
    a, b = decisions.queues["a"], decisions.queues["b"]
    assert a.weight is not None and b.weight is not None and a.weight < b.weight
    assert a.fair_share.gpu < 4 < b.fair_share.gpu
    # b took GPUs back from a beyond the even split.
    assert b.allocated.gpu > 4
    queues = [record.queue for record in store.list_queues()]
    reason = weight_reason(queues[0], a, decay_settings(queues))
    assert reason is not None and reason.startswith("weight 1 → 0")
    assert "100% of the cluster's GPU-time over a 1h half-life" in reason
    # Turned off since that cycle: the queue's own settings have nothing to explain, even
    # before a cycle runs again (the scheduler's process answers a moment later).
    store.update_queue("a", {"fair_share_half_life": None}, None)
    queues = [record.queue for record in store.list_queues()]
    assert weight_reason(queues[0], a, decay_settings(queues)) is None


def test_queues_of_before_have_time_decay_off(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = store_of_before(url, "0006_ux")
    try:
        queue = old.get_queue("team").queue
        assert (queue.fair_share_half_life, queue.fair_share_k) == (None, None)
        assert old.advance_usage(1000.0) == {}
        old.update_queue("team", {"fair_share_half_life": HOUR}, None)
        assert old.advance_usage(1000.0) == {"team": 0.0}
    finally:
        old.close()
