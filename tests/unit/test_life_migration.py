"""Migration 0006_life (0007_life.py, after 0006_launch) on a store made by
0003_memberships: a workload of before belongs to no array, waits for nothing, is
scheduled, and can be cancelled."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from corral.store import Store
from corral.store.database import MIGRATIONS


def test_a_store_of_0003_memberships_is_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003_memberships")
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO queues (id, name, parent_id, deserved_gpu, weight_gpu, weight_cpu,"
                " weight_memory, priority, created_at) VALUES (1, 'team', NULL, 4, 1, 1, 1,"
                " 100, 0)"
            )
        )
        connection.execute(
            sa.text(
                'INSERT INTO workloads (id, name, queue_id, "user", priority, preemptible,'
                " node_selector, topology_required, command, env, backoff_limit, grace_period,"
                " status, attempts, failures, created_at) VALUES (1, 'old', 1, 'alice', 50,"
                " true, '{}', true, '[]', '{}', 0, 30, 'pending', 0, 0, 100)"
            )
        )
    engine.dispose()
    store = Store(url)
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
