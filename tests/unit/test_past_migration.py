"""Migration 0018_past on a store made by 0017_failing: events of before get the id of the
workload that has their name now, unless they are older than it (an earlier workload of
the same name, deleted since), and no attempt; workloads of before keep directories named
by their name alone (their running tasks write there), new ones get NAME.ID."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from corral.model import TaskGroup
from corral.model.spec import WorkloadSpec
from corral.store import Store
from corral.store.history import HistoryQuery
from migration_support import OLD_QUEUE, OLD_WORKLOAD, migrated

# (time, workload, kind): OLD_WORKLOAD, named "old", was submitted at 100.
EVENTS = (
    (50.0, "old", "submitted"),  # an earlier "old", deleted at 60
    (55.0, "old", "preempted"),
    (60.0, "old", "deleted"),
    (100.0, "old", "submitted"),
    (120.0, "old", "preempted"),
    (130.0, "gone", "submitted"),
    (140.0, None, "node-ready"),
)


def test_events_of_before_are_kept_by_the_id_of_their_workload(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = migrated(url, "0017_failing")
    with engine.begin() as connection:
        connection.execute(sa.text(OLD_QUEUE))
        connection.execute(sa.text(OLD_WORKLOAD))
        for at, workload, kind in EVENTS:
            connection.execute(
                sa.text(
                    "INSERT INTO events (time, workload, node, kind, cause, reason)"
                    " VALUES (:at, :workload, NULL, :kind, 'test', '')"
                ),
                {"at": at, "workload": workload, "kind": kind},
            )
    engine.dispose()
    store = Store(url)
    try:
        assert [(e.time, e.kind) for e in store.events("old")] == [
            (100.0, "submitted"),
            (120.0, "preempted"),
        ]
        assert {e.attempt for e in store.events()} == {None}
        assert len(store.events()) == len(EVENTS)
        [record] = store.history(HistoryQuery())
        assert record.evictions == 1
        assert store.get_workload("old").directory == "old"
        spec = WorkloadSpec("new", "team", "alice", (TaskGroup(gpu=1),), command=("true",))
        new = store.submit(spec)
        assert store.get_workload("new").directory == f"new.{new.id}"
    finally:
        store.close()
