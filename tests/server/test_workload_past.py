"""A workload's past is its own (issue 39), against a real store on SQLite and PostgreSQL:
a workload that takes a deleted one's name gets an id never given before and starts with
no events, while the deleted one's events stay in the table."""

from __future__ import annotations

from corral.model import Decisions, Eviction, Node, Placement, Queue, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.history import HistoryQuery
from corral.store.reports import Ended


def _setup(store: Store) -> None:
    store.create_queue(Queue("team"))
    devices = tuple(Device(i, f"uuid-{i}", "generic", 80 << 30, True) for i in range(2))
    store.register_node(NodeSpec(Node("n1", gpus=2), devices, virtual=True))


def _submit(store: Store, name: str) -> int:
    spec = WorkloadSpec(name, "team", "alice", (TaskGroup(gpu=1),), command=("true",))
    return store.submit(spec).id


def _bind(store: Store, name: str) -> None:
    store.apply(Decisions({name: (Placement(0, "n1", (0,), 1.0),)}, (), {}, {}))


def test_a_reused_name_starts_with_no_events_and_a_new_id(store: Store) -> None:
    _setup(store)
    first = _submit(store, "x")
    _bind(store, "x")
    store.apply(Decisions({}, (Eviction("x", (0,), "preempt", "y", "for y"),), {}, {}))
    # The newest workload is deleted: SQLite would give its id to the next row.
    store.delete_workload("x", "alice")
    second = _submit(store, "x")
    assert second > first
    assert [e.kind for e in store.events("x")] == ["submitted"]
    # The first one's events stay, as the audit trail.
    everything = [(e.workload, e.kind) for e in store.events()]
    assert ("x", "preempted") in everything and ("x", "deleted") in everything
    # Nor does history count the first one's eviction.
    [record] = store.history(HistoryQuery())
    assert (record.workload.id, record.evictions) == (second, 0)


def test_a_reused_name_gets_a_new_id_after_a_restart_of_the_store(store: Store) -> None:
    _setup(store)
    first = _submit(store, "x")
    store.delete_workload("x", "alice")
    again = Store(store.url)
    try:
        assert _submit(again, "x") > first
    finally:
        again.close()


def test_the_end_of_a_deleted_workloads_task_is_not_a_later_ones_of_its_name(
    store: Store,
) -> None:
    _setup(store)
    _submit(store, "x")
    _bind(store, "x")
    old = store.get_workload("x").directory
    store.delete_workload("x", "alice")
    _submit(store, "x")
    _bind(store, "x")
    new = store.get_workload("x")
    assert (old, new.directory) == (f"x.{new.id - 1}", f"x.{new.id}")
    # The first one's task, stopped when it was deleted, ends as the task bound now would:
    # same name, task, attempt and launch. Its directory tells them apart.
    store.write_reports([Ended("n1", "x", 0, 143, "killed by SIGTERM", 1, 1, None, old)])
    assert store.get_workload("x").status == "running"
    store.write_reports([Ended("n1", "x", 0, 0, "exited with code 0", 1, 1, None, new.directory)])
    assert store.get_workload("x").status == "succeeded"
