"""The store shared by two processes (the server's API and its scheduler): the write lock
holds between them, a lock whose process died is free again, and the generation and its
journal are the database's, so each process sees the other's changes. On SQLite and on
PostgreSQL, with a real second process."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from corral.model import Decisions, Node, Queue, Resources, Snapshot, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.server.scheduler import SchedulerLoop
from corral.store import Store

# A second process that opens the store, takes the write lock, says so, and keeps it
# until its standard input ends (or it is killed).
HOLDER = """
import sys
from corral.store import Store
store = Store(sys.argv[1], migrate=False)
with store.writing():
    print("held", flush=True)
    sys.stdin.read()
"""

# A second process that makes one relevant change and prints the generation it sees.
WRITER = """
import sys
from corral.store import Store
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
def held_elsewhere(store: Store) -> Iterator[subprocess.Popen[str]]:
    """The write lock, held by another process until the block ends."""
    holder = other(HOLDER, store.url)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)


def submitting(store: Store, name: str) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def submit() -> None:
        store.submit(spec(name))
        done.set()

    thread = threading.Thread(target=submit)
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
