"""Migration 0006_ux on a store made by 0003_memberships: workloads of before get no
`pending_since`, and so wait from their submission."""

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
        run = connection.execute
        run(
            sa.text(
                "INSERT INTO queues (id, name, parent_id, deserved_gpu, weight_gpu, weight_cpu,"
                " weight_memory, priority, created_at) VALUES (1, 'team', NULL, 4, 1, 1, 1,"
                " 100, 0)"
            )
        )
        run(
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
        assert old.pending_since is None and old.waiting_since == 100
        store.suspend("old", "test")
        resumed = store.resume("old", "test")
        assert resumed.pending_since is not None and resumed.waiting_since > 100
    finally:
        store.close()
