"""Migration 0006_sched on a store made by 0003_memberships: queues of before have no
min-runtime (inherited, so off), and one set afterwards is kept."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from corral.store import Store
from corral.store.database import MIGRATIONS


def test_queues_of_before_have_no_min_runtime(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003_memberships")
        connection.execute(
            sa.text(
                "INSERT INTO queues (id, name, parent_id, deserved_gpu, weight_gpu, weight_cpu,"
                " weight_memory, priority, created_at) VALUES (1, 'team', NULL, 4, 1, 1, 1,"
                " 100, 0)"
            )
        )
    engine.dispose()
    store = Store(url)
    try:
        queue = store.get_queue("team").queue
        assert (queue.preempt_min_runtime, queue.reclaim_min_runtime) == (None, None)
        store.update_queue("team", {"reclaim_min_runtime": 600.0}, None)
        queue = store.get_queue("team").queue
        assert (queue.preempt_min_runtime, queue.reclaim_min_runtime) == (None, 600.0)
    finally:
        store.close()
