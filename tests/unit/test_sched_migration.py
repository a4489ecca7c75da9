"""Migration 0006_sched on a store made by 0003_memberships: queues of before have no
min-runtime (inherited, so off), and one set afterwards is kept."""

from __future__ import annotations

from pathlib import Path

from migration_support import store_of_before


def test_queues_of_before_have_no_min_runtime(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = store_of_before(url, "0003_memberships")
    try:
        queue = store.get_queue("team").queue
        assert (queue.preempt_min_runtime, queue.reclaim_min_runtime) == (None, None)
        store.update_queue("team", {"reclaim_min_runtime": 600.0}, None)
        queue = store.get_queue("team").queue
        assert (queue.preempt_min_runtime, queue.reclaim_min_runtime) == (None, 600.0)
    finally:
        store.close()
