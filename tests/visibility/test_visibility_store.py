"""Allocation intervals follow placements through every path that binds or frees devices;
the snapshot marks idle work; queue rules suspend idle work and stop overlong work. On a
real store, SQLite and PostgreSQL."""

from __future__ import annotations

import math
import time

import pytest
import sqlalchemy as sa
from sqlalchemy import update
from vis_timeline import sample

from corral.model import Decisions, Eviction, Node, Placement, Queue, Resources, TaskGroup
from corral.model.durations import format_duration
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Invalid, Store
from corral.store.reports import Ended
from corral.store.rules import (
    enforce_rules,
    normalize_rules,
    queue_rules,
    set_rules,
    workload_class,
)
from corral.store.telemetry import record_samples
from corral.store.telemetry_schema import AllocationRow
from corral.store.usage import Allocation, allocations, open_allocations
from migration_support import upgrade_to

EVERYTHING = (0.0, math.inf)


def cluster(store: Store) -> None:
    store.register_node(
        NodeSpec(
            Node("n1", gpus=4),
            tuple(Device(i, f"v-{i}", "virtual", 80 << 30, True) for i in range(4)),
            virtual=True,
        )
    )
    store.create_queue(Queue("research", deserved=Resources(4.0, math.inf, math.inf)))
    store.create_queue(Queue("vision", parent="research"))


def submit(store: Store, name: str, gpu: float = 2.0, priority: int = 50, tasks: int = 1) -> None:
    store.submit(
        WorkloadSpec(name, "vision", "alice", (TaskGroup("worker", tasks, gpu),), priority=priority)
    )


def bind(store: Store, name: str, *placements: Placement) -> None:
    store.apply(Decisions({name: placements}, (), {}, {}))


def intervals(store: Store, workload: str) -> list[Allocation]:
    return [a for a in allocations(store, *EVERYTHING) if a.workload == workload]


def test_binding_opens_an_interval_and_every_release_closes_it(store: Store) -> None:
    cluster(store)
    submit(store, "w1")
    before = time.time()
    bind(store, "w1", Placement(0, "n1", (0, 1), 2.0))
    [held] = intervals(store, "w1")
    assert (held.project, held.departments, held.user, held.priority) == (
        "vision",
        ("research",),
        "alice",
        50,
    )
    assert (held.node, held.devices, held.gpu, held.task) == ("n1", (0, 1), 2.0, 0)
    assert held.end is None and held.start >= before
    assert [a.workload for a in open_allocations(store)] == ["w1"]

    # Preempted: closed. Bound again elsewhere: a second interval.
    store.apply(Decisions({}, (Eviction("w1", (0,), "preempt", "other", "test"),), {}, {}))
    [closed] = intervals(store, "w1")
    assert closed.end is not None and closed.end >= closed.start
    bind(store, "w1", Placement(0, "n1", (2, 3), 2.0))
    assert [(a.devices, a.end is None) for a in intervals(store, "w1")] == [
        ((0, 1), False),
        ((2, 3), True),
    ]

    # Suspended, resumed, bound, then deleted: every interval ends closed.
    store.suspend("w1", "alice")
    assert open_allocations(store) == []
    store.resume("w1", "alice")
    bind(store, "w1", Placement(0, "n1", (0, 1), 2.0))
    assert len(open_allocations(store)) == 1
    store.delete_workload("w1", "alice")
    assert open_allocations(store) == []
    assert len(intervals(store, "w1")) == 3  # the record outlives the workload


def test_ending_failing_and_losing_the_node_close_intervals(store: Store) -> None:
    cluster(store)
    submit(store, "gang", gpu=1.0, tasks=2)
    bind(store, "gang", Placement(0, "n1", (0,), 1.0), Placement(1, "n1", (1,), 1.0))
    submit(store, "half", gpu=0.5)
    bind(store, "half", Placement(0, "n1", (2,), 0.5))
    assert len(open_allocations(store)) == 3

    # A task that exits 0 keeps its devices until the whole gang is done.
    store.task_ended("gang", 0, 0, "exited with code 0")
    assert len(open_allocations(store)) == 3
    store.task_ended("gang", 1, 0, "exited with code 0")
    assert [a.workload for a in open_allocations(store)] == ["half"]
    assert store.get_workload("gang").status == "succeeded"

    store.remove_node("n1")
    assert open_allocations(store) == []
    assert store.get_workload("half").status == "pending"


def test_the_end_of_an_earlier_attempt_does_not_end_the_task_bound_now(store: Store) -> None:
    cluster(store)
    submit(store, "w1", gpu=1.0)
    bind(store, "w1", Placement(0, "n1", (0,), 1.0))
    first = store.get_workload("w1").attempts
    # Preempted, and bound again before the old process's end is reported.
    store.apply(Decisions({}, (Eviction("w1", (0,), "preempt", "other", "test"),), {}, {}))
    bind(store, "w1", Placement(0, "n1", (1,), 1.0))
    assert store.get_workload("w1").attempts == first + 1
    assert store.task_ended("w1", 0, 143, "preempted: for other", first) == []
    record = store.get_workload("w1")
    assert (record.status, record.attempts, len(open_allocations(store))) == ("running", 2, 1)
    # The current attempt's end counts.
    store.task_ended("w1", 0, 0, "exited with code 0", first + 1)
    assert store.get_workload("w1").status == "succeeded"


def test_the_end_of_a_shrunk_task_does_not_end_the_same_task_grown_again(store: Store) -> None:
    # An elastic workload keeps running (and keeps its attempt) while it shrinks and grows:
    # the end of a task evicted by reclaim arrives after the same task number was bound
    # again. Only the launch the end belongs to may be charged with it.
    cluster(store)
    store.submit(
        WorkloadSpec("elastic", "vision", "alice", (TaskGroup("worker", 3, 1.0),), min_available=1)
    )
    bind(store, "elastic", *(Placement(t, "n1", (t,), 1.0) for t in range(3)))
    [old] = [t for w in store.bound_work(names={"elastic"}) for t in w.tasks if t.task == 1]
    store.apply(Decisions({}, (Eviction("elastic", (1, 2), "reclaim", "other", "test"),), {}, {}))
    bind(store, "elastic", Placement(1, "n1", (3,), 1.0))
    [new] = [t for w in store.bound_work(names={"elastic"}) for t in w.tasks if t.task == 1]
    attempt = store.get_workload("elastic").attempts
    assert new.launch != old.launch
    # As the dispatcher writes agents' reports: in a batch.
    stale = Ended("n1", "elastic", 1, 143, "preempted: reclaim for other", attempt, old.launch)
    assert store.write_reports([stale]).releases == []
    record = store.get_workload("elastic")
    assert (record.status, record.reason, sorted(p.task for p in record.placements)) == (
        "running",
        None,
        [0, 1],
    )
    # The end of the launch bound now counts: it fails the workload and stops task 0.
    [stop] = store.task_ended("elastic", 1, 1, "exited with code 1", attempt, new.launch)
    assert (stop.tasks, store.get_workload("elastic").status) == ((0,), "failed")


def age_allocation(store: Store, workload: str, seconds: float) -> None:
    """Pretend the workload was bound `seconds` ago."""
    with store.write() as session:
        session.execute(
            update(AllocationRow)
            .where(AllocationRow.workload == workload)
            .values(start=time.time() - seconds)
        )


def quiet_for(workload: str, seconds: float, now: float, busy_at: float | None = None) -> list:
    samples = [
        sample(now - seconds + i * 5, 0, workload=workload, seconds=5)
        for i in range(int(seconds // 5) + 1)
    ]
    if busy_at is not None:
        samples.append(sample(now - busy_at, 40, workload=workload, seconds=5))
    return samples


def test_the_snapshot_marks_work_idle_for_five_minutes(store: Store) -> None:
    cluster(store)
    for name in ("quiet", "woke", "fresh"):
        submit(store, name, gpu=1.0)
    bind(store, "quiet", Placement(0, "n1", (0,), 1.0))
    bind(store, "woke", Placement(0, "n1", (1,), 1.0))
    bind(store, "fresh", Placement(0, "n1", (2,), 1.0))
    now = time.time()
    for name in ("quiet", "woke"):
        age_allocation(store, name, 900)
    record_samples(store, quiet_for("quiet", 400, now))
    record_samples(store, quiet_for("woke", 400, now, busy_at=100))
    # Bound just now: its quiet samples from before are not its own.
    record_samples(store, quiet_for("fresh", 400, now - 1))
    idle = {w.name: w.idle for w in store.snapshot().workloads}
    assert idle == {"quiet": True, "woke": False, "fresh": False}


def test_rules_suspend_idle_work_and_stop_overlong_work(store: Store) -> None:
    cluster(store)
    set_rules(
        store,
        "research",
        {"interactive": {"idle_timeout": "10m"}, "train": {"max_runtime": "1h"}},
    )
    submit(store, "notebook", gpu=1.0, priority=100)
    submit(store, "training", gpu=1.0, priority=50)
    submit(store, "serving", gpu=1.0, priority=125)
    for index, name in enumerate(("notebook", "training", "serving")):
        bind(store, name, Placement(0, "n1", (index,), 1.0))
        age_allocation(store, name, 4000)
    now = time.time()
    for name in ("notebook", "training", "serving"):
        record_samples(store, quiet_for(name, 700, now))

    done = {item.record.name: item for item in enforce_rules(store, now)}
    assert sorted(done) == ["notebook", "training"]  # no rule for inference work
    notebook = store.get_workload("notebook")
    assert notebook.status == "suspended" and notebook.placements == ()
    assert notebook.reason == "GPUs idle for 10m (rule of queue research for build work)"
    [event] = [e for e in store.events("notebook") if e.kind == "suspended"]
    assert (event.cause, event.reason) == ("idle-timeout", notebook.reason)
    assert done["notebook"].record.placements == (Placement(0, "n1", (0,), 1.0),)

    training = store.get_workload("training")
    assert training.status == "failed"
    assert training.reason is not None and training.reason.startswith("ran for 1h6m")
    assert training.reason.endswith(
        "past the maximum runtime of 1h (rule of queue research for train work)"
    )
    assert store.get_workload("serving").status == "running"
    assert [a.workload for a in open_allocations(store)] == ["serving"]
    assert enforce_rules(store, now) == []


def test_the_nearest_queue_decides_and_busy_work_is_left_alone(store: Store) -> None:
    cluster(store)
    set_rules(store, "research", {"build": {"idle_timeout": 600}})
    set_rules(store, "vision", {"build": {"idle_timeout": "2h"}})
    submit(store, "idle-notebook", gpu=1.0, priority=100)
    bind(store, "idle-notebook", Placement(0, "n1", (0,), 1.0))
    age_allocation(store, "idle-notebook", 4000)
    now = time.time()
    record_samples(store, quiet_for("idle-notebook", 700, now))
    assert enforce_rules(store, now) == []  # vision's 2 hours, not research's 10 minutes

    set_rules(store, "vision", None)
    submit(store, "busy-notebook", gpu=1.0, priority=100)
    bind(store, "busy-notebook", Placement(0, "n1", (1,), 1.0))
    age_allocation(store, "busy-notebook", 4000)
    record_samples(store, quiet_for("busy-notebook", 700, now, busy_at=300))
    assert [item.record.name for item in enforce_rules(store, now)] == ["idle-notebook"]


def test_rules_are_validated_field_by_field(store: Store) -> None:
    cluster(store)
    with pytest.raises(Invalid) as bad_class:
        set_rules(store, "vision", {"batch": {"idle_timeout": 60}})
    assert bad_class.value.field == "rules.batch"
    with pytest.raises(Invalid) as bad_value:
        set_rules(store, "vision", {"interactive": {"idle_timeout": "soon"}})
    assert bad_value.value.field == "rules.interactive.idle_timeout"
    with pytest.raises(Invalid) as negative:
        set_rules(store, "vision", {"train": {"max_runtime": -5}})
    assert negative.value.field == "rules.train.max_runtime"
    with pytest.raises(Invalid) as twice:
        set_rules(store, "vision", {"build": {}, "interactive": {}})
    assert twice.value.field == "rules.interactive"
    assert normalize_rules({"interactive": {"idle_timeout": "30m"}}) == {
        "build": {"idle_timeout": 1800.0, "max_runtime": None}
    }


def test_a_queue_and_its_rules_are_written_together_or_not_at_all(store: Store) -> None:
    cluster(store)
    with pytest.raises(Invalid) as refused:
        store.create_queue(Queue("nlp", parent="research"), {"batch": {"idle_timeout": 60}})
    assert refused.value.field == "rules.batch"
    assert "nlp" not in [record.queue.name for record in store.list_queues()]
    assert not [event for event in store.events() if "nlp" in event.reason]

    with pytest.raises(Invalid):
        store.update_queue("vision", {"priority": 7}, {"train": {"max_runtime": -5}})
    assert store.get_queue("vision").queue.priority == Queue("vision").priority

    store.create_queue(Queue("nlp", parent="research"), {"build": {"idle_timeout": "30m"}})
    assert queue_rules(store, "nlp") == {"build": {"idle_timeout": 1800.0, "max_runtime": None}}
    store.update_queue("nlp", {}, {})
    assert queue_rules(store, "nlp") == {}


def test_workload_classes_and_durations() -> None:
    assert [workload_class(p) for p in (0, 50, 60, 75, 99, 100, 124, 125, 1000)] == [
        "train",
        "train",
        "train",
        "build-preemptible",
        "build-preemptible",
        "build",
        "build",
        "inference",
        "inference",
    ]
    assert [format_duration(s) for s in (6, 59.5, 60, 1800, 5400, 86400, 90061)] == [
        "6s",
        "59.5s",
        "1m",
        "30m",
        "1h30m",
        "1d",
        "1d1h1m1s",
    ]


def test_upgrading_gives_running_work_an_open_interval(store: Store) -> None:
    """Placements made before migration 0002 keep their GPU-hours from when they were
    bound: the migration opens their intervals."""
    url = store.url
    store.close()
    engine = sa.create_engine(url)
    # Every table goes, those of later migrations too (in the order their foreign keys
    # need), to start again from 0001.
    tables = sa.MetaData()
    tables.reflect(engine)
    tables.drop_all(engine)
    upgrade_to(engine, "0001")
    with engine.begin() as connection:
        run = connection.execute
        run(
            sa.text(
                "INSERT INTO queues (id, name, parent_id, deserved_gpu, weight_gpu, weight_cpu,"
                " weight_memory, priority, created_at) VALUES"
                " (1, 'org', NULL, 4, 1, 1, 1, 100, 0), (2, 'team', 1, 4, 1, 1, 1, 100, 0)"
            )
        )
        run(
            sa.text(
                "INSERT INTO nodes (id, name, gpu_model, gpu_memory, cpu, memory, labels,"
                " schedulable, state, virtual, address, registered_at) VALUES"
                " (1, 'n1', 'v', 1, 8, 1, '{}', true, 'ready', true, '127.0.0.1', 0)"
            )
        )
        run(
            sa.text(
                'INSERT INTO workloads (id, name, queue_id, "user", priority, preemptible,'
                " node_selector, topology_required, command, env, backoff_limit, grace_period,"
                " status, attempts, failures, created_at) VALUES (1, 'old', 2, 'carol', 50,"
                " true, '{}', true, '[]', '{}', 0, 30, 'running', 1, 0, 100)"
            )
        )
        run(
            sa.text(
                "INSERT INTO placements (id, workload_id, task, node_id, devices, gpu,"
                " created_at, state) VALUES (1, 1, 0, 1, '[0, 1]', 2, 1234.5, 'running')"
            )
        )
    engine.dispose()
    upgraded = Store(url)
    try:
        [held] = open_allocations(upgraded)
        assert held == Allocation(
            "old", 0, "team", ("org",), "carol", 50, "n1", (0, 1), 2.0, 1234.5, None
        )
    finally:
        upgraded.close()
