"""The store's side of a workload's life, on SQLite and PostgreSQL: held work left out of
the snapshot until its dependencies are met, arrays offered up to their running limit,
cancel, update, and history's exit codes, evictions and GPU-hours."""

from __future__ import annotations

import pytest

from corral.model import Decisions, Eviction, Node, Placement, Queue, TaskGroup
from corral.model.arrays import ArrayMember, Dependency
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Conflict, Invalid, Store
from corral.store.history import HistoryQuery


def _setup(store: Store, gpus: int = 4) -> None:
    store.create_queue(Queue("team"))
    devices = tuple(Device(i, f"uuid-{i}", "generic", 80 << 30, True) for i in range(gpus))
    store.register_node(NodeSpec(Node("n1", gpus=gpus), devices, virtual=True))


def _spec(name: str, **fields: object) -> WorkloadSpec:
    return WorkloadSpec(name, "team", "alice", (TaskGroup(gpu=1),), **fields)  # type: ignore[arg-type]


def _bind(store: Store, name: str, device: int = 0) -> None:
    store.apply(Decisions({name: (Placement(0, "n1", (device,), 1.0),)}, (), {}, {}))


def _pending(store: Store) -> list[str]:
    return [w.name for w in store.snapshot().workloads if not w.placements]


def test_held_work_joins_the_snapshot_once_its_dependency_succeeds(store: Store) -> None:
    _setup(store)
    store.submit(_spec("a"))
    store.submit(_spec("b", after=(Dependency("a"),)))
    store.submit(_spec("c", after=(Dependency("a", "any"),)))
    assert _pending(store) == ["a"]
    assert store.resolve_holds() == []
    assert store.get_workload("b").reason == "waiting for a to succeed"
    _bind(store, "a")
    generation = store.generation
    assert store.resolve_holds() == []
    # Nothing changed: the generation stays, so a blocked workload costs cycles nothing.
    assert store.generation == generation
    store.task_ended("a", 0, 0, "exited with code 0")
    assert store.resolve_holds() == ["b", "c"]
    assert store.generation == generation + 2
    assert _pending(store) == ["b", "c"]
    assert store.get_workload("b").reason is None
    assert [e.kind for e in store.events("b")] == ["submitted", "released"]


def test_a_failed_dependency_blocks_or_cancels(store: Store) -> None:
    _setup(store)
    store.submit(_spec("a"))
    store.submit(_spec("b", after=(Dependency("a"),)))
    store.submit(_spec("c", after=(Dependency("a"),), kill_on_invalid_dep=True))
    _bind(store, "a")
    store.task_ended("a", 0, 3, "exited with code 3")
    assert store.resolve_holds() == ["c"]
    blocked, cancelled = store.get_workload("b"), store.get_workload("c")
    assert blocked.status == "pending"
    assert blocked.reason == (
        "dependency a failed; it can never succeed (cancel or delete this workload)"
    )
    assert (cancelled.status, cancelled.cancelled_by) == ("cancelled", "scheduler")
    assert _pending(store) == []
    # A dependency deleted since is one that will never succeed either.
    store.submit(_spec("d"))
    store.submit(_spec("e", after=(Dependency("d"),)))
    store.delete_workload("d", "alice")
    store.resolve_holds()
    assert store.get_workload("e").reason is not None
    assert "d deleted" in (store.get_workload("e").reason or "")


def test_unknown_dependency_is_invalid(store: Store) -> None:
    _setup(store)
    with pytest.raises(Invalid) as caught:
        store.submit(_spec("b", after=(Dependency("ghost"),)))
    assert caught.value.field == "after"
    assert store.list_workloads() == []


def test_an_array_is_offered_up_to_its_limit(store: Store) -> None:
    _setup(store, gpus=8)
    store.submit_all(
        [_spec(f"arr-{i}", array=ArrayMember("arr", i, 2)) for i in range(5)] + [_spec("free")]
    )
    snapshot, newest = store.read_snapshot()
    assert [w.name for w in snapshot.workloads] == ["arr-0", "arr-1", "free"]
    # Members left out count as read: a kept snapshot does not read them again.
    assert newest == store.get_workload("free").id
    # The same rule on the workloads read since a kept snapshot.
    assert [w.name for w in store.new_workloads(0)[0]] == ["arr-0", "arr-1", "free"]
    _bind(store, "arr-0")
    assert _pending(store) == ["arr-1", "free"]
    _bind(store, "arr-1", device=1)
    assert _pending(store) == ["free"]
    store.task_ended("arr-0", 0, 0, "exited with code 0")
    assert _pending(store) == ["arr-2", "free"]
    assert [w.name for w in store.list_workloads(array="arr")] == [f"arr-{i}" for i in range(5)]
    before, released = store.cancel("arr", "alice")
    assert [r.name for r in before] == ["arr-1", "arr-2", "arr-3", "arr-4"]
    assert [r.workload for r in released] == ["arr-1"]
    assert {r.status for r in store.list_workloads(array="arr")} == {"succeeded", "cancelled"}
    with pytest.raises(Conflict):
        store.cancel("arr", "alice")


def test_cancel_and_update(store: Store) -> None:
    _setup(store)
    store.submit(_spec("a"))
    store.submit(_spec("b"))
    _bind(store, "a")
    with pytest.raises(Conflict):
        store.update_workload("a", {"priority": 100}, "alice")
    changed = store.update_workload("b", {"priority": 100, "max_runtime": 60.0}, "alice")
    assert (changed.spec.priority, changed.spec.max_runtime) == (100, 60.0)
    with pytest.raises(ValueError, match="command"):
        store.update_workload("b", {"command": ["x"]}, "alice")
    before, released = store.cancel("a", "bob")
    assert before[0].placements and [r.tasks for r in released] == [(0,)]
    record = store.get_workload("a")
    assert (record.status, record.cancelled_by, record.placements) == ("cancelled", "bob", ())
    assert record.finished_at is not None
    with pytest.raises(Conflict, match="delete removes"):
        store.cancel("a", "bob")
    # An end reported after the cancel changes nothing.
    store.task_ended("a", 0, 143, "killed")
    assert store.get_workload("a").status == "cancelled"


def test_history_counts_exit_codes_evictions_and_gpu_hours(store: Store) -> None:
    _setup(store)
    store.submit(_spec("a", backoff_limit=1))
    store.submit(_spec("b"))
    _bind(store, "a")
    store.apply(Decisions({}, (Eviction("a", (0,), "preempt", "x", "test"),), {}, {}))
    _bind(store, "a")
    store.task_ended("a", 0, 2, "exited with code 2")
    _bind(store, "a")
    store.task_ended("a", 0, 5, "exited with code 5")
    rows = store.history(HistoryQuery())
    assert [row.workload.name for row in rows] == ["a", "b"]
    a, b = rows
    assert (a.workload.status, a.workload.exit_code, a.evictions) == ("failed", 5, 1)
    assert a.workload.attempts == 3 and a.gpu_seconds > 0
    assert (b.workload.status, b.evictions, b.gpu_seconds) == ("pending", 0, 0.0)
    assert [r.workload.name for r in store.history(HistoryQuery(state="failed"))] == ["a"]
    assert [r.workload.name for r in store.history(HistoryQuery(user="bob"))] == []
    assert [r.workload.name for r in store.history(HistoryQuery(projects=()))] == []
    assert [r.workload.name for r in store.history(HistoryQuery(limit=1))] == ["b"]
