"""The store keeps each workload's last checkpoint as its agents report it, the snapshot
says how much work each running workload would lose (`since_checkpoint`), and a
preemption records what it lost; on SQLite and PostgreSQL, and across migration 0011."""

from __future__ import annotations

import math
import time
from pathlib import Path

from sqlalchemy import update

from corral.model import Decisions, Eviction, Node, Placement, Queue, Resources, TaskGroup
from corral.model.durations import lost_work_phrase
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.reports import Checkpointed
from corral.store.schema import PlacementRow, WorkloadRow
from migration_support import store_of_before

HOUR = 3600.0


def _cluster(store: Store, names: tuple[str, ...], gpus: int = 2) -> None:
    for node in ("n1", "n2"):
        store.register_node(
            NodeSpec(
                Node(node, gpus=gpus),
                tuple(Device(i, f"{node}-{i}", "virtual", 80 << 30, True) for i in range(gpus)),
                virtual=True,
            )
        )
    store.create_queue(Queue("q", deserved=Resources(4.0, math.inf, math.inf)))
    for name in names:
        store.submit(WorkloadSpec(name, "q", "alice", (TaskGroup("worker", 1, 2.0),)))


def _bound_ago(store: Store, seconds: float) -> None:
    with store.write() as session:
        session.execute(update(PlacementRow).values(created_at=PlacementRow.created_at - seconds))


def _snapshot(store: Store) -> dict[str, object]:
    return {w.name: w for w in store.snapshot().workloads}


def test_checkpoints_fill_since_checkpoint_and_only_the_running_node_speaks(
    store: Store,
) -> None:
    _cluster(store, ("a", "b", "waiting"))
    store.apply(
        Decisions(
            {"a": (Placement(0, "n1", (0, 1), 2.0),), "b": (Placement(0, "n2", (0, 1), 2.0),)},
            (),
            {},
            {},
        )
    )
    _bound_ago(store, HOUR)
    now = time.time()
    store.write_reports(
        [
            Checkpointed("n1", "a", now - 600),
            # Another node does not run b: not taken.
            Checkpointed("n1", "b", now - 60),
            # Nor a workload that does not run, nor one that does not exist.
            Checkpointed("n1", "waiting", now - 60),
            Checkpointed("n1", "nobody", now - 60),
        ]
    )
    workloads = _snapshot(store)
    a, b, waiting = workloads["a"], workloads["b"], workloads["waiting"]
    assert 600 <= a.since_checkpoint < 700  # type: ignore[attr-defined]
    # No checkpoint known: everything since its run started would be lost.
    assert HOUR <= b.since_checkpoint < HOUR + 100  # type: ignore[attr-defined]
    assert waiting.since_checkpoint is None  # type: ignore[attr-defined]
    assert store.get_workload("a").checkpoint_at == now - 600
    assert store.get_workload("b").checkpoint_at is None

    # A checkpoint never goes back, and one in the future counts as now.
    store.write_reports([Checkpointed("n1", "a", now - 3000)])
    assert store.get_workload("a").checkpoint_at == now - 600
    store.write_reports([Checkpointed("n1", "a", now + 10 * HOUR)])
    kept = store.get_workload("a").checkpoint_at
    assert kept is not None and now <= kept <= time.time()
    assert 0 <= _snapshot(store)["a"].since_checkpoint < 60  # type: ignore[attr-defined]
    store.write_reports([Checkpointed("n1", "a", math.nan)])
    assert store.get_workload("a").checkpoint_at == kept


def test_a_checkpoint_before_the_run_started_counts_from_the_start(store: Store) -> None:
    _cluster(store, ("a",))
    store.apply(Decisions({"a": (Placement(0, "n1", (0, 1), 2.0),)}, (), {}, {}))
    # A checkpoint of an earlier run (an hour before this one was bound): the work before
    # this run was lost or kept already, so only this run's counts.
    store.write_reports([Checkpointed("n1", "a", time.time() - HOUR)])
    since = _snapshot(store)["a"].since_checkpoint  # type: ignore[attr-defined]
    assert 0 <= since < 60


def test_a_preemption_records_the_work_lost_since_the_last_checkpoint(store: Store) -> None:
    _cluster(store, ("saved", "unsaved"))
    store.apply(
        Decisions(
            {
                "saved": (Placement(0, "n1", (0, 1), 2.0),),
                "unsaved": (Placement(0, "n2", (0, 1), 2.0),),
            },
            (),
            {},
            {},
        )
    )
    _bound_ago(store, HOUR)
    now = time.time()
    store.write_reports([Checkpointed("n1", "saved", now - 360)])
    store.apply(
        Decisions(
            {},
            (
                Eviction("saved", (0,), "preempt", "urgent", "for more urgent work"),
                Eviction("unsaved", (0,), "preempt", "urgent", "for more urgent work"),
            ),
            {},
            {},
        )
    )
    saved = store.get_workload("saved")
    assert saved.status == "pending"
    lost = saved.lost_work
    assert lost is not None and lost.from_checkpoint
    # 2 GPUs for 6 minutes.
    assert 720 <= lost.gpu_seconds < 720 + 60
    assert lost.since == now - 360 and 360 <= lost.at - lost.since < 400
    phrase = lost_work_phrase(lost.gpu_seconds, lost.at - lost.since, lost.from_checkpoint)
    assert phrase == "lost 12 GPU-min of work: last checkpoint 6 min before preemption"
    unsaved = store.get_workload("unsaved").lost_work
    assert unsaved is not None and not unsaved.from_checkpoint
    assert 2 * HOUR <= unsaved.gpu_seconds < 2 * HOUR + 200
    events = [e for e in store.events("saved", 10) if e.kind == "preempted"]
    assert events[-1].reason.startswith("preempted: preempt for urgent: for more urgent work; ")
    assert events[-1].reason.endswith(phrase)

    # Bound again, its old checkpoint predates the new run: evicted at once, it lost
    # only the seconds of the new run, counted from its start.
    store.apply(Decisions({"saved": (Placement(0, "n1", (0, 1), 2.0),)}, (), {}, {}))
    assert (_snapshot(store)["saved"].since_checkpoint or 0) < 60  # type: ignore[attr-defined]
    store.apply(Decisions({}, (Eviction("saved", (0,), "preempt", "urgent", "again"),), {}, {}))
    again = store.get_workload("saved").lost_work
    assert again is not None and not again.from_checkpoint and again.gpu_seconds < 120


def test_a_checkpoint_in_the_grace_period_saves_the_work_the_preemption_was_to_lose(
    store: Store,
) -> None:
    _cluster(store, ("a", "b"))
    store.apply(
        Decisions(
            {"a": (Placement(0, "n1", (0, 1), 2.0),), "b": (Placement(0, "n2", (0, 1), 2.0),)},
            (),
            {},
            {},
        )
    )
    _bound_ago(store, HOUR)
    evict = tuple(Eviction(name, (0,), "preempt", "urgent", "x") for name in ("a", "b"))
    store.apply(Decisions({}, evict, {}, {}))
    with store.write() as session:
        # Preempted 200 s ago, so that the reports below are of times in the past (a later
        # one would count as now).
        session.execute(update(WorkloadRow).values(preempted_at=WorkloadRow.preempted_at - 200))
    lost = store.get_workload("a").lost_work
    assert lost is not None and lost.gpu_seconds >= 2 * HOUR
    grace = store.get_workload("a").spec.grace_period
    assert grace + 60 < 200
    # a checkpointed on SIGTERM; b's report comes from long after its grace period.
    store.write_reports(
        [
            Checkpointed("n1", "a", lost.at + 1),
            Checkpointed("n2", "b", lost.at + grace + 60),
        ]
    )
    saved = store.get_workload("a")
    assert saved.checkpoint_at == lost.at + 1
    assert saved.lost_work is not None
    assert (saved.lost_work.gpu_seconds, saved.lost_work.from_checkpoint) == (0.0, True)
    assert saved.lost_work.since - saved.lost_work.at == 1
    assert lost_work_phrase(0.0, -1.0, True) == "lost no work: it checkpointed when asked to stop"
    late = store.get_workload("b")
    assert late.checkpoint_at is None
    assert late.lost_work is not None and late.lost_work.gpu_seconds >= 2 * HOUR


def test_a_store_of_0006_ux_is_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = store_of_before(url, "0006_ux")
    try:
        old = store.get_workload("old")
        assert old.checkpoint_at is None and old.lost_work is None
    finally:
        store.close()
