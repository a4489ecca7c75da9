"""The reads and writes the control plane makes at cluster scale, and what they must keep:
every node and all bound work in a few plain selects (the same records as the reads of
one node or one workload give), agents' reports many to a transaction (in order, each as
it would be alone), a scheduler that re-reads only the workloads whose tasks ended,
cycles that name more workloads than a statement takes parameters, and PostgreSQL's
statistics kept up with a burst of submissions.

Each runs against a real store in this process, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from corral.control.dispatch import Dispatcher
from corral.control.reports import ReportWriter
from corral.control.scheduler import SchedulerLoop
from corral.messages import Reports, TaskLaunch, TaskStop
from corral.model import (
    Decisions,
    Eviction,
    Node,
    Placement,
    Queue,
    Resources,
    TaskGroup,
    Workload,
)
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store, database
from corral.store.database import ANALYZE_ROWS
from corral.store.records import NodeState
from corral.store.reports import Beat, Ended, Outcome, Started

# Minutes of work: started before the other modules (tests/conftest.py).
pytestmark = pytest.mark.long


def spec(name: str, replicas: int = 1, gpu: float = 1.0, **extra: Any) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        project="team",
        user="alice",
        task_groups=(TaskGroup("main", replicas, gpu),),
        command=("true",),
        **extra,
    )


def node(name: str, gpus: int = 4, **labels: str) -> NodeSpec:
    return NodeSpec(
        Node(name, gpus=gpus, labels=labels),
        tuple(Device(i, f"{name}-{i}", "virtual", 80 << 30, True) for i in range(gpus)),
        virtual=True,
    )


def bound(store: Store) -> Store:
    """Three nodes; a gang across two of them, a half-GPU task, a task of its own, and a
    pending workload."""
    store.create_queue(Queue("team", deserved=Resources(gpu=12)))
    for index in range(3):
        store.register_node(node(f"n{index}", rack=f"r{index % 2}"))
    store.submit(spec("gang", replicas=2, gpu=4.0, env={"A": "1"}))
    store.submit(spec("half", gpu=0.5, max_runtime=60.0))
    store.submit(spec("single", gpu=2.0))
    store.submit(spec("waiting", gpu=4.0))
    store.apply(
        Decisions(
            {
                "gang": (
                    Placement(0, "n0", (0, 1, 2, 3), 4.0),
                    Placement(1, "n1", (0, 1, 2, 3), 4.0),
                ),
                "half": (Placement(0, "n2", (0,), 0.5),),
                "single": (Placement(0, "n2", (2, 3), 2.0),),
            },
            (),
            {},
            {},
        )
    )
    assert store.task_started("gang", 1, 4242, 99)
    return store


def test_every_node_read_at_once_is_each_node_read_alone(store: Store) -> None:
    bound(store)
    listed = store.list_nodes()
    assert [record.node.name for record in listed] == ["n0", "n1", "n2"]
    assert listed == [store.get_node(record.node.name) for record in listed]
    assert store.node_states() == [NodeState(r.node.name, r.state, r.heartbeat_at) for r in listed]
    n2 = listed[2]
    assert [(t.workload, t.task, t.devices, t.gpu) for t in n2.tasks] == [
        ("half", 0, (0,), 0.5),
        ("single", 0, (2, 3), 2.0),
    ]
    assert n2.node.labels == {"rack": "r0"} and len(n2.devices) == 4


def test_all_bound_work_read_at_once_is_each_workload_read_alone(store: Store) -> None:
    bound(store)
    work = store.bound_work()
    assert [w.workload.name for w in work] == ["gang", "half", "single"]
    for item in work:
        assert item.workload == store.get_workload(item.workload.name)
    gang = work[0]
    assert [(t.task, t.node, t.devices, t.state, t.pid) for t in gang.tasks] == [
        (0, "n0", (0, 1, 2, 3), "bound", None),
        (1, "n1", (0, 1, 2, 3), "running", 4242),
    ]
    assert gang.tasks[0].device_memory == 80 << 30 and gang.workload.spec.env == {"A": "1"}
    # By node (a gang once, whichever of its nodes are named) and by name.
    assert [w.workload.name for w in store.bound_work(nodes={"n1"})] == ["gang"]
    assert [w.workload.name for w in store.bound_work(nodes={"n0", "n1"})] == ["gang"]
    assert [w.workload.name for w in store.bound_work(nodes={"n2"})] == ["half", "single"]
    assert store.bound_work(nodes=set()) == []
    assert [w.workload.name for w in store.bound_work(names={"single", "waiting"})] == ["single"]


def test_reports_are_written_in_order_in_one_transaction(store: Store) -> None:
    bound(store)
    before = store.generation
    outcome = store.write_reports(
        [
            Started("n2", "half", 0, 100, 1),
            Ended("n2", "half", 0, 0, "exited with code 0"),
            # Not bound: its process must stop.
            Started("n2", "waiting", 0, 101, 1),
            # The end of a task reported by a node it is not bound to changes nothing.
            Ended("n2", "gang", 0, 1, "exited with code 1"),
            # A gang's task fails while n0, where the rest of it runs, has not been heard
            # from since: the verdict waits (tests/server/test_gang_fate.py).
            Ended("n1", "gang", 1, 1, "exited with code 1"),
            Beat("n0"),
        ]
    )
    assert outcome.unbound == [Started("n2", "waiting", 0, 101, 1)]
    assert outcome.releases == []
    assert outcome.ended == {"half", "gang"} and not outcome.revived
    assert store.get_workload("half").status == "succeeded"
    assert store.get_workload("gang").status == "running"
    assert store.get_workload("single").status == "running"
    kinds = [e.kind for e in store.events(limit=6)]
    assert kinds[-4:] == ["task-started", "task-exited", "succeeded", "task-exited"]
    # One relevant change, which names the only workloads it touched.
    assert store.generation == before + 1
    assert store.changed_since(before, store.generation) == {"half", "gang"}
    # Decided: the rest of the gang is released.
    stopped = store.settle_failing(0.0)
    assert [(r.workload, r.node, r.tasks) for r in stopped] == [("gang", "n0", (0,))]
    assert store.get_workload("gang").status == "failed"
    assert store.changed_since(before + 1, store.generation) == {"gang"}
    assert store.integrity_problems() == []


def test_a_heartbeat_that_revives_a_node_may_change_anything(store: Store) -> None:
    bound(store)
    silent = {"n0": 9.0, "n1": 9.0, "n2": 9.0}
    lost, _ = store.expire_nodes(silent, time.time() + 1)
    assert lost == {"n0": ["gang"], "n1": [], "n2": ["half", "single"]}
    before = store.generation
    outcome = store.write_reports([Beat("n1")])
    assert outcome.revived
    assert store.get_node("n1").state == "ready"
    assert store.changed_since(before, store.generation) is None
    # Beats of ready nodes are not relevant changes.
    store.write_reports([Beat("n1")])
    assert store.generation == before + 1


def test_the_journal_forgets_nothing_it_cannot_name(store: Store) -> None:
    bound(store)
    start = store.generation
    store.task_ended("single", 0, 0, "exited with code 0")
    assert store.changed_since(start, store.generation) == {"single"}
    store.set_schedulable("n0", False)
    assert store.changed_since(start, store.generation) is None
    assert store.changed_since(store.generation, store.generation) == frozenset()
    assert store.changed_since(store.generation, start) is None


def test_the_writer_writes_every_report_and_flush_waits_for_them(store: Store) -> None:
    bound(store)
    outcomes: list[Outcome] = []
    writer = ReportWriter(store, outcomes.append)
    for number in range(300):
        writer.put(Beat(f"n{number % 3}"))
    writer.put(Ended("n2", "single", 0, 0, "exited with code 0"))
    writer.flush()
    assert store.get_workload("single").status == "succeeded"
    assert any(o.ended == {"single"} for o in outcomes)
    writer.stop()
    # After stop, a report is written at once by its caller.
    writer.put(Ended("n2", "half", 0, 0, "exited with code 0"))
    assert store.get_workload("half").status == "succeeded"


def test_a_report_the_store_refuses_loses_no_other(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound(store)
    writer = ReportWriter(store, lambda _outcome: None)
    real = store.write_reports

    def refuse_gang(batch: Any) -> Outcome:
        if any(getattr(report, "workload", None) == "gang" for report in batch):
            raise RuntimeError("refused")
        return real(batch)

    monkeypatch.setattr(store, "write_reports", refuse_gang)
    # Queued together while the writer cannot take them: one batch, then one by one.
    with writer._changed:
        writer.put(Ended("n0", "gang", 0, 0, "exited with code 0"))
        writer.put(Ended("n2", "single", 0, 0, "exited with code 0"))
    writer.flush()
    writer.stop()
    assert store.get_workload("single").status == "succeeded"
    assert store.get_workload("gang").status == "running"


def test_the_scheduler_reads_again_only_the_workloads_whose_tasks_ended(
    store: Store, tmp_path: Path
) -> None:
    bound(store)
    loop = SchedulerLoop(store)
    loop.verify = True
    loop.run_cycle()
    assert loop.full_snapshots == 1
    dispatcher = Dispatcher(store, _NoCluster(), tmp_path, loop.trigger)
    dispatcher.task_ended("n2", "single", 0, 0, "exited with code 0")
    dispatcher.task_ended("n1", "gang", 1, 1, "exited with code 1")
    dispatcher.reports.flush()
    # The gang's failure is decided (n0 was not heard from since: after the loss timeout).
    store.settle_failing(0.0)
    # Checked against a full read (verify): the gang's 8 GPUs are free again.
    decisions = loop.run_cycle()
    assert loop.full_snapshots == 1
    assert set(decisions.bindings) == {"waiting"}
    dispatcher.reports.stop()


# More workloads than a statement takes parameters. SQLite's bound is lowered to 999, the
# bound of older builds (sqlite3_limit; Python's SQLite here takes 250,000 and builds by
# default 32,766): every statement of the store is shared by both databases, and COPY,
# PostgreSQL's only statement of its own, takes none, so what passes under 999 passes
# under PostgreSQL's 65,535. PostgreSQL reads the same chunked statements in its order.
WIDE = 3_000
SQLITE_VARIABLES = 999


def test_a_cycle_may_name_more_workloads_than_a_statement_takes_parameters(
    store: Store,
) -> None:
    # 1,200 GPUs, one workload on each (more than one IN list of bulk.CHUNK), and every
    # other workload pending: the cycle's writes and the scheduler's reads by name.
    if store.url.startswith("sqlite"):
        bounded(store, SQLITE_VARIABLES)
    store.create_queue(Queue("team", deserved=Resources(gpu=1200)))
    for index in range(300):
        store.register_node(node(f"n{index}"))
    names = [f"w{i}" for i in range(WIDE)]
    for start in range(0, WIDE, 1000):
        outcomes = store.submit_many([spec(name) for name in names[start : start + 1000]])
        assert not [o for o in outcomes if isinstance(o, Exception)]
    placed = names[:1200]
    bindings = {n: (Placement(0, f"n{i // 4}", (i % 4,), 1.0),) for i, n in enumerate(placed)}
    store.apply(Decisions(bindings, (), {name: "waits" for name in names[1200:]}, {}))
    assert store.get_workload(placed[-1]).status == "running"
    assert [store.get_workload(n).reason for n in (names[1200], names[-1])] == ["waits"] * 2
    # Evicted: 1,000 workloads go back to pending, their allocation intervals closed.
    evicted = placed[:1000]
    store.apply(
        Decisions({}, tuple(Eviction(n, (0,), "reclaim", "other", "test") for n in evicted), {}, {})
    )
    assert store.get_workload(evicted[-1]).status == "pending"
    assert store.get_workload(placed[-1]).status == "running"
    # Read by name, all of them: as the full read has them, in the same order (the
    # times they have run and waited aside, which grow between the two reads).
    snapshot, newest = store.read_snapshot()
    assert len(snapshot.workloads) == WIDE
    named = store.named_workloads(reversed(names), newest)
    assert [_timeless(w) for w in named] == [_timeless(w) for w in snapshot.workloads]


def bounded(store: Store, variables: int) -> None:
    """Every connection of the SQLite `store` from now on takes at most `variables`
    parameters per statement (those pooled already are closed)."""

    def limit(connection: sqlite3.Connection, _: Any) -> None:
        connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, variables)

    event.listen(store.engine, "connect", limit)
    store.engine.dispose()
    over = tuple(range(variables + 1))
    with store.engine.connect() as connection, pytest.raises(OperationalError, match="too many"):
        # The bound holds: a statement over it is refused.
        connection.exec_driver_sql(f"SELECT {', '.join(['?'] * len(over))}", over)


def _timeless(workload: Workload) -> Workload:
    return replace(workload, running_for=None, since_checkpoint=None, waiting_for=None)


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_postgresql_statistics_follow_a_burst_of_submissions(store: Store) -> None:
    # Autovacuum would refresh them too, about once a minute: not within this test.
    with store.engine.begin() as connection:
        for table in ("workloads", "task_groups"):
            connection.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))

    def counted() -> list[float]:
        with store.engine.connect() as connection:
            return [
                connection.execute(
                    text("SELECT reltuples FROM pg_class WHERE relname = :table"),
                    {"table": table},
                ).scalar_one()
                for table in ("workloads", "task_groups")
            ]

    def refreshed(expected: float) -> list[float]:
        # On a thread of the store's own: soon, not at once.
        deadline = time.monotonic() + 30
        while (found := counted()) != [expected, expected] and time.monotonic() < deadline:
            time.sleep(0.02)
        return found

    store.create_queue(Queue("team", deserved=Resources(gpu=8)))
    assert counted() == [-1, -1]  # never analyzed
    store.submit_many([spec(f"a{i}") for i in range(ANALYZE_ROWS - 1)])
    time.sleep(0.5)
    assert counted() == [-1, -1]
    store.submit(spec("one-more"))  # alone, as a request's submission is written
    assert refreshed(ANALYZE_ROWS) == [ANALYZE_ROWS, ANALYZE_ROWS]
    # Then when they have grown by ANALYZE_ROWS again (a fifth of 1,000 is fewer).
    store.submit_all([spec(f"b{i}") for i in range(ANALYZE_ROWS - 1)])
    time.sleep(0.5)
    assert counted() == [ANALYZE_ROWS, ANALYZE_ROWS]
    store.submit_many([spec("last")])
    assert refreshed(2 * ANALYZE_ROWS) == [2 * ANALYZE_ROWS, 2 * ANALYZE_ROWS]


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_a_submission_does_not_wait_for_the_statistics(store: Store) -> None:
    store.create_queue(Queue("team", deserved=Resources(gpu=8)))
    store.submit_many([spec(f"a{i}") for i in range(ANALYZE_ROWS - 1)])
    # ANALYZE waits for this lock (it conflicts with its own), held for as long as the
    # test likes; inserts do not.
    blocker = store.engine.connect()
    blocker.execute(text("LOCK TABLE workloads IN SHARE UPDATE EXCLUSIVE MODE"))
    try:
        done = threading.Event()

        def submit() -> None:
            store.submit(spec("crosses-the-line"))
            done.set()

        threading.Thread(target=submit, daemon=True).start()
        assert done.wait(10), "the submission waited for ANALYZE"
        assert store.get_workload("crosses-the-line").status == "pending"
        # Meanwhile more work is written; no second ANALYZE is started for it.
        store.submit_many([spec(f"b{i}") for i in range(ANALYZE_ROWS)])
        analyzing = [t for t in threading.enumerate() if t.name == "corral-analyze"]
        assert len(analyzing) == 1
    finally:
        blocker.rollback()
        blocker.close()
    analyzing[0].join(30)
    with store.engine.connect() as connection:
        refreshed = connection.execute(
            text("SELECT reltuples FROM pg_class WHERE relname = 'workloads'")
        ).scalar_one()
    assert refreshed >= ANALYZE_ROWS


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_statistics_that_cannot_be_refreshed_fail_no_submission(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store.create_queue(Queue("team", deserved=Resources(gpu=8)))
    monkeypatch.setattr(database, "_GROWN", ("no_such_table",))

    def warned() -> bool:
        deadline = time.monotonic() + 30
        while "could not refresh the planner's statistics" not in caplog.text:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    outcomes = store.submit_many([spec(f"a{i}") for i in range(ANALYZE_ROWS)])
    assert not [o for o in outcomes if isinstance(o, Exception)]
    assert store.get_workload("a0").status == "pending"
    assert warned()
    # Tried again with the next submission, once that try is over.
    while any(t.name == "corral-analyze" for t in threading.enumerate()):
        time.sleep(0.02)
    caplog.clear()
    store.submit(spec("next"))
    assert warned()


class _NoCluster:
    """A cluster with no agents: starts and stops are accepted and forgotten."""

    def connect(self, reports: Reports) -> None:
        pass

    def start(self, launches: list[TaskLaunch]) -> None:
        pass

    def stop(self, stops: list[TaskStop]) -> None:
        pass

    def running(self, node: str) -> set[tuple[str, int]] | None:
        return set()

    def strays(self, node: str) -> set[tuple[str, int]]:
        return set()

    def close(self) -> None:
        pass
