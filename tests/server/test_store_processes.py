"""The store shared by two processes (the server's API and its scheduler): the write lock
holds between them (but, on PostgreSQL, a scheduling cycle's does not hold up new work,
nor new work a cycle), a lock whose process died is free again, and the generation and its
journal are the database's, so each process sees the other's changes. On SQLite and on
PostgreSQL, with a real second process."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from corral.control.scheduler import SchedulerLoop
from corral.model import Decisions, Node, Queue, Resources, Snapshot, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.audit import AuditQuery, AuditRecord

# A second process that opens the store, takes the write lock (as a scheduling cycle
# takes it, with "cycle"; or the lock of new work only, with "new"), says so, and keeps it
# until its standard input ends (or it is killed).
HOLDER = """
import sys
from corral.store import Store
from corral.store.audit import AuditQuery, AuditRecord
store = Store(sys.argv[1], migrate=False)
mode = sys.argv[2]
if mode == "new":
    held = store.holding_new_work()
else:
    held = store.writing(beside_new_work=mode == "cycle")
with held:
    print("held", flush=True)
    sys.stdin.read()
"""

# A second process that makes one relevant change and prints the generation it sees.
WRITER = """
import sys
from corral.store import Store
from corral.store.audit import AuditQuery, AuditRecord
store = Store(sys.argv[1], migrate=False)
if sys.argv[2] == "end":
    store.task_ended("w0", 0, 0, "done")
else:
    store.set_schedulable("n0", False)
print(store.generation, flush=True)
"""


def prepared(store: Store) -> None:
    store.create_queue(Queue("team", deserved=Resources(gpu=4)))
    devices = tuple(Device(i, f"n0-{i}", "virtual", 80 << 30, True) for i in range(4))
    store.register_node(NodeSpec(Node("n0", gpus=4), devices, virtual=True))


def spec(name: str) -> WorkloadSpec:
    return WorkloadSpec(name, "team", "alice", (TaskGroup(gpu=1.0),))


def other(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@contextmanager
def held_elsewhere(store: Store, mode: str = "write") -> Iterator[subprocess.Popen[str]]:
    """The write lock (`HOLDER`'s modes), held by another process until the block ends."""
    holder = other(HOLDER, store.url, mode)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)


def submitting(store: Store, name: str) -> tuple[threading.Thread, threading.Event]:
    return running(lambda: store.submit(spec(name)))


def running(call: Callable[[], object]) -> tuple[threading.Thread, threading.Event]:
    """`call` on a thread of its own, and the event set when it has returned."""
    done = threading.Event()

    def run() -> None:
        call()
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def test_the_write_lock_holds_between_processes(store: Store) -> None:
    prepared(store)
    with held_elsewhere(store) as holder:
        thread, done = submitting(store, "w0")
        # The other process holds the lock: the submission waits for it.
        assert not done.wait(0.5)
        assert holder.stdin is not None
        holder.stdin.close()
        assert done.wait(10)
        thread.join(10)
    assert [r.name for r in store.list_workloads()] == ["w0"]


def test_a_cycle_elsewhere_does_not_hold_up_new_work_on_postgresql(store: Store) -> None:
    # A scheduling cycle writes its decisions beside new rows: on PostgreSQL submissions
    # (alone and in a batch) and the audit records of other requests are written
    # meanwhile, and any other write waits; on SQLite, one writer at a time, all wait.
    prepared(store)
    record = AuditRecord(1.0, "alice", "POST", "/api/v1/workloads/batch", "/x", None, 201)
    with held_elsewhere(store, "cycle") as holder:
        thread, done = submitting(store, "w0")
        batch, batch_done = running(lambda: store.submit_all([spec("w1"), spec("w2")]))
        audit, audited = running(lambda: store.add_audit([record]))
        cordon, cordoned = running(lambda: store.set_schedulable("n0", False))
        assert done.wait(10) is not store.sqlite
        assert batch_done.wait(0.5 if store.sqlite else 10) is not store.sqlite
        assert audited.wait(0.5 if store.sqlite else 10) is not store.sqlite
        assert not cordoned.wait(0.5)
        assert holder.stdin is not None
        holder.stdin.close()
        for started, finished in (
            (thread, done),
            (batch, batch_done),
            (audit, audited),
            (cordon, cordoned),
        ):
            assert finished.wait(10)
            started.join(10)
    assert [r.name for r in store.list_workloads()] == ["w0", "w1", "w2"]
    assert [r.route for r in store.list_audit(AuditQuery())] == [record.route]
    assert not store.get_node("n0").node.schedulable


def test_new_work_elsewhere_holds_up_every_writer_but_a_cycle(store: Store) -> None:
    # While another process adds new work: other submissions and any other write wait;
    # a cycle's write does not on PostgreSQL (on SQLite new work holds the write lock).
    prepared(store)
    with held_elsewhere(store, "new") as holder:

        def cycle() -> None:
            with store.writing(beside_new_work=True):
                pass

        writer, written = running(cycle)
        assert written.wait(0.5 if store.sqlite else 10) is not store.sqlite
        thread, done = submitting(store, "w0")
        # (Taken the write lock, it waits for new work's: a cycle now waits behind it.)
        cordon, cordoned = running(lambda: store.set_schedulable("n0", False))
        assert not done.wait(0.5)
        assert not cordoned.wait(0.1)
        assert holder.stdin is not None
        holder.stdin.close()
        for started, finished in ((thread, done), (cordon, cordoned), (writer, written)):
            assert finished.wait(10)
            started.join(10)
    assert [r.name for r in store.list_workloads()] == ["w0"]


def test_a_lock_whose_process_died_is_free_again(store: Store) -> None:
    prepared(store)
    with held_elsewhere(store) as holder:
        thread, done = submitting(store, "w0")
        assert not done.wait(0.5)
        holder.kill()
        assert done.wait(10)
        thread.join(10)
    assert [r.name for r in store.list_workloads()] == ["w0"]


def test_each_process_sees_the_others_changes(store: Store) -> None:
    prepared(store)
    store.submit(spec("w0"))
    loop = SchedulerLoop(store)
    assert set(loop.run_cycle().bindings) == {"w0"}
    before = store.generation
    # A task's end, in another process: counted, with the workload it touched.
    writer = other(WRITER, store.url, "end")
    out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0
    assert int(out) == before + 1 == store.generation
    assert store.changed_since(before, store.generation) == {"w0"}
    # A change that may touch anything: counted, and named as such.
    writer = other(WRITER, store.url, "cordon")
    out, _ = writer.communicate(timeout=60)
    assert int(out) == before + 2 == store.generation
    assert store.changed_since(before, store.generation) is None
    assert store.changed_since(before + 2, store.generation) == frozenset()


def test_a_cycle_is_not_written_over_another_processs_change(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle computed before another process's relevant change is computed again: the
    node the other process cordoned meanwhile gets nothing."""
    prepared(store)
    store.submit(spec("w0"))
    loop = SchedulerLoop(store)
    decide = loop._decide
    cordoned = []

    def decide_then_cordon(snapshot: Snapshot) -> Decisions:
        decisions = decide(snapshot)
        if not cordoned:
            writer = other(WRITER, store.url, "cordon")
            writer.communicate(timeout=60)
            cordoned.append(writer.returncode)
        return decisions

    monkeypatch.setattr(loop, "_decide", decide_then_cordon)
    decisions = loop.run_cycle()
    assert cordoned == [0]
    assert decisions.bindings == {}
    assert store.get_workload("w0").status == "pending"
