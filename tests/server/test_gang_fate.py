"""A gang's fate follows its cause (docs/multi-node.md): an end that corral caused (a
fenced node, an order of the server's) requeues the gang whole without using a retry; a
task's own non-zero end fails the workload, but not before every node of its other tasks
has been heard from since, for it may be the victim of a node that is being lost. Each
against a real store, on SQLite and on PostgreSQL."""

from __future__ import annotations

import time

from corral.messages import FENCED, STOPPED
from corral.model import Decisions, Node, Placement, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.reports import Beat, Ended

FAILED = "exited with code 1"


def node(name: str) -> NodeSpec:
    return NodeSpec(
        Node(name, gpus=2),
        tuple(Device(i, f"{name}-{i}", "virtual", 80 << 30, True) for i in range(2)),
        virtual=True,
    )


def gang(store: Store, backoff_limit: int = 0, nodes: tuple[str, ...] = ("a", "b")) -> None:
    """Nodes a, b and c; a gang `g` of one task on each of `nodes`, running."""
    store.create_queue(Queue("team", deserved=Resources(gpu=6)))
    for name in ("a", "b", "c"):
        store.register_node(node(name))
    store.submit(
        WorkloadSpec(
            name="g",
            project="team",
            user="alice",
            task_groups=(TaskGroup("main", len(nodes), 1.0),),
            command=("true",),
            backoff_limit=backoff_limit,
        )
    )
    placements = tuple(
        Placement(task, where, (task if nodes.count(where) > 1 else 0,), 1.0)
        for task, where in enumerate(nodes)
    )
    store.apply(Decisions({"g": placements}, (), {}, {}))
    for task in range(len(nodes)):
        assert store.task_started("g", task, 1000 + task, 1)


def heard(store: Store, *nodes: str) -> None:
    """The nodes' agents answer, later than any end reported so far counts for."""
    time.sleep(1.1)
    store.write_reports([Beat(name) for name in nodes])


def kinds(store: Store) -> list[str]:
    return [event.kind for event in store.events("g", limit=50)]


def failures(store: Store) -> int:
    """The workload's own failures so far: each is a retry, or its end."""
    return sum(kind in ("retrying", "failed") for kind in kinds(store))


def test_a_fenced_task_requeues_its_gang_whole_and_uses_no_retry(store: Store) -> None:
    gang(store)
    reason = "fenced: its node was cut off from the cluster for 4 s"
    outcome = store.write_reports([Ended("b", "g", 1, 137, reason, 1, None, FENCED)])
    workload = store.get_workload("g")
    assert workload.status == "pending" and workload.placements == ()
    assert workload.reason == f"requeued: task 1 on b {reason}"
    assert failures(store) == 0
    # Its task on the other node is stopped.
    assert [(r.node, r.tasks) for r in outcome.releases] == [("a", (0,))]
    (requeued,) = [e for e in store.events("g", limit=50) if e.kind == "requeued"]
    assert requeued.node == "b" and "fenced" in requeued.reason
    assert "failed" not in kinds(store) and "retrying" not in kinds(store)


def test_a_task_stopped_by_the_server_is_never_a_failure_whatever_its_code(store: Store) -> None:
    gang(store)
    store.write_reports([Ended("a", "g", 0, 0, "stopped: node c was lost", 1, None, STOPPED)])
    assert store.get_workload("g").status == "pending"
    assert failures(store) == 0


def test_a_failure_waits_for_the_other_node_and_a_lost_node_requeues_it(store: Store) -> None:
    gang(store)
    # Rank 0 on a ends with 1 (its peer on b vanished): b has not been heard from since.
    outcome = store.write_reports([Ended("a", "g", 0, 1, FAILED, 1)])
    assert outcome.releases == []
    waiting = store.get_workload("g")
    assert waiting.status == "running"
    assert "waits for node b" in (waiting.reason or "")
    # b is declared lost: the gang is requeued, and its failure counts for nothing.
    lost, stopped = store.expire_nodes({"b": 10.0}, time.time() + 1)
    assert lost == {"b": ["g"]} and stopped == []
    workload = store.get_workload("g")
    assert workload.status == "pending" and workload.placements == ()
    assert workload.reason == "requeued: node b was lost (no answer for 10 s)"
    assert failures(store) == 0
    assert kinds(store)[-1] == "requeued"
    # Nothing is left waiting.
    assert store.settle_failing(0.0) == []
    assert store.get_workload("g").status == "pending"


def test_a_failure_is_the_workloads_once_the_other_node_answers(store: Store) -> None:
    gang(store, backoff_limit=1)
    store.write_reports([Ended("a", "g", 0, 1, FAILED, 1)])
    assert store.settle_failing(60.0) == []
    assert store.get_workload("g").status == "running", "b was not heard from since"
    heard(store, "b")
    stopped = store.settle_failing(60.0)
    assert [(r.node, r.tasks) for r in stopped] == [("b", (1,))]
    workload = store.get_workload("g")
    assert workload.status == "pending"
    assert workload.reason == f"retrying (1 of 1): task 0 on a {FAILED}"
    assert failures(store) == 1


def test_a_failure_is_decided_after_the_loss_timeout_at_the_latest(store: Store) -> None:
    gang(store)
    store.write_reports([Ended("a", "g", 0, 1, FAILED, 1)])
    store.settle_failing(0.0)
    workload = store.get_workload("g")
    assert workload.status == "failed"
    assert workload.reason == f"task 0 on a {FAILED}"


def test_a_fenced_peer_during_the_wait_makes_it_a_requeue(store: Store) -> None:
    gang(store)
    store.write_reports([Ended("a", "g", 0, 1, FAILED, 1)])
    store.write_reports([Ended("b", "g", 1, 137, "fenced: cut off", 1, None, FENCED)])
    workload = store.get_workload("g")
    assert workload.status == "pending"
    assert failures(store) == 0
    store.settle_failing(0.0)
    assert store.get_workload("g").status == "pending"


def test_every_failed_task_is_named_when_the_verdict_comes(store: Store) -> None:
    gang(store, nodes=("a", "b", "c"))
    store.write_reports([Ended("a", "g", 0, 1, FAILED, 1)])
    store.write_reports([Ended("b", "g", 1, 2, "exited with code 2", 1)])
    heard(store, "c")
    store.settle_failing(60.0)
    workload = store.get_workload("g")
    assert workload.status == "failed"
    assert workload.reason == f"task 0 on a {FAILED}; task 1 on b exited with code 2"


def test_no_wait_without_a_task_on_another_node(store: Store) -> None:
    # The gang's other task runs on the node that reported the end: it was just heard.
    gang(store, nodes=("a", "a"))
    store.write_reports([Ended("a", "g", 0, 1, FAILED, 1)])
    assert store.get_workload("g").status == "failed"


def test_a_gang_whose_tasks_failed_and_succeeded_does_not_succeed(store: Store) -> None:
    gang(store)
    store.write_reports([Ended("a", "g", 0, 1, FAILED, 1)])
    store.write_reports([Ended("b", "g", 1, 0, "exited with code 0", 1)])
    assert store.get_workload("g").status == "failed"
