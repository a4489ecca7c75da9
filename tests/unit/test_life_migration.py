"""Migration 0006_life (0007_life.py, after 0006_launch) on a store made by
0003_memberships: a workload of before belongs to no array, waits for nothing, is
scheduled, and can be cancelled."""

from __future__ import annotations

from pathlib import Path

from migration_support import store_of_before


def test_a_store_of_0003_memberships_is_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = store_of_before(url, "0003_memberships")
    try:
        old = store.get_workload("old")
        assert (old.spec.array, old.spec.after, old.spec.kill_on_invalid_dep) == (None, (), False)
        assert (old.exit_code, old.cancelled_by) == (None, None)
        assert [w.name for w in store.snapshot().workloads] == ["old"]
        assert store.resolve_holds() == []
        store.cancel("old", "alice")
        assert store.get_workload("old").status == "cancelled"
    finally:
        store.close()
