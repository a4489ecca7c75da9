"""Every run of a workload is an attempt, and its events say which (`corral describe`
lists the attempts with their causes), against a real store on SQLite and PostgreSQL:
the `bound` that starts a run and the event that ends it (requeued for a fenced or lost
node, preempted, retrying or failed for the workload's own failure, succeeded, cancelled)
carry its number, and so does every event in between. An elastic workload that shrinks
or grows goes on with the same attempt."""

from __future__ import annotations

import time

from corral.messages import FENCED
from corral.model import Decisions, Eviction, Node, Placement, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.reports import Beat, Ended


def _setup(store: Store) -> None:
    store.create_queue(Queue("team", deserved=Resources(gpu=2)))
    devices = tuple(Device(i, f"n1-{i}", "virtual", 80 << 30, True) for i in range(2))
    store.register_node(NodeSpec(Node("n1", gpus=2), devices, virtual=True))


def _submit(store: Store, name: str, tasks: int = 1, **fields: object) -> None:
    group = TaskGroup("main", tasks, 1.0)
    store.submit(WorkloadSpec(name, "team", "alice", (group,), command=("true",), **fields))  # type: ignore[arg-type]


def _run(store: Store, name: str, tasks: tuple[int, ...] = (0,)) -> None:
    """Bind tasks of `name` on n1 (task i on device i) and start them."""
    placements = tuple(Placement(task, "n1", (task,), 1.0) for task in tasks)
    store.apply(Decisions({name: placements}, (), {}, {}))
    for task in tasks:
        assert store.task_started(name, task, 1000 + task, 1)


def _ended(store: Store, name: str, code: int, reason: str, cause: str | None = None) -> None:
    attempt = store.get_workload(name).attempts
    store.write_reports([Ended("n1", name, 0, code, reason, attempt, None, cause)])


def _attempts(store: Store, name: str) -> list[tuple[str, int | None]]:
    return [(event.kind, event.attempt) for event in store.events(name)]


def test_each_run_is_an_attempt_and_its_events_say_which(store: Store) -> None:
    _setup(store)
    _submit(store, "w", backoff_limit=1)
    # 1: its node fenced it. 2: preempted. 3: its own failure, retried. 4: lost node.
    # 5: succeeded.
    _run(store, "w")
    _ended(store, "w", 137, "fenced: its node was cut off from the cluster for 4 s", FENCED)
    _run(store, "w")
    store.apply(Decisions({}, (Eviction("w", (0,), "reclaim", "v", "for v"),), {}, {}))
    _run(store, "w")
    _ended(store, "w", 3, "exited with code 3")
    _run(store, "w")
    store.write_reports([Beat("n1")])
    store.expire_nodes({"n1": 12.0}, time.time() + 1)
    store.write_reports([Beat("n1")])
    _run(store, "w")
    _ended(store, "w", 0, "exited with code 0")
    run = ["bound", "task-started"]
    assert _attempts(store, "w") == [
        ("submitted", None),
        *((kind, 1) for kind in run),
        ("requeued", 1),
        *((kind, 2) for kind in run),
        ("preempted", 2),
        *((kind, 3) for kind in run),
        ("retrying", 3),
        *((kind, 4) for kind in run),
        ("requeued", 4),
        *((kind, 5) for kind in run),
        ("task-exited", 5),
        ("succeeded", 5),
    ]
    workload = store.get_workload("w")
    assert (workload.attempts, workload.status) == (5, "succeeded")


def test_an_elastic_workload_that_shrinks_and_grows_keeps_its_attempt(store: Store) -> None:
    _setup(store)
    _submit(store, "e", tasks=2, min_available=1)
    _run(store, "e", (0, 1))
    store.apply(Decisions({}, (Eviction("e", (1,), "reclaim", "v", "for v"),), {}, {}))
    assert store.get_workload("e").status == "running"
    _run(store, "e", (1,))
    store.cancel("e", "alice")
    assert _attempts(store, "e") == [
        ("submitted", None),
        ("bound", 1),
        ("task-started", 1),
        ("task-started", 1),
        ("preempted", 1),
        ("bound", 1),
        ("task-started", 1),
        ("cancelled", 1),
    ]


def test_work_that_waits_is_in_no_attempt(store: Store) -> None:
    _setup(store)
    _submit(store, "p")
    store.suspend("p", "alice")
    store.resume("p", "alice")
    store.update_workload("p", {"priority": 10}, "alice")
    store.cancel("p", "alice")
    assert {attempt for _, attempt in _attempts(store, "p")} == {None}
