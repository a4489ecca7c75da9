"""For the tests of migrations: a store brought by Alembic to an older revision, and the
rows of a store from before 0006 (one project, one pending workload)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from corral.store import Store
from corral.store.database import MIGRATIONS

# Rows of a store from before 0006: columns every revision from 0002 on has.
OLD_QUEUE = (
    "INSERT INTO queues (id, name, parent_id, deserved_gpu, weight_gpu, weight_cpu,"
    " weight_memory, priority, created_at) VALUES (1, 'team', NULL, 4, 1, 1, 1, 100, 0)"
)
OLD_WORKLOAD = (
    'INSERT INTO workloads (id, name, queue_id, "user", priority, preemptible,'
    " node_selector, topology_required, command, env, backoff_limit, grace_period,"
    " status, attempts, failures, created_at) VALUES (1, 'old', 1, 'alice', 50,"
    " true, '{}', true, '[]', '{}', 0, 30, 'pending', 0, 0, 100)"
)


def upgrade_to(engine: sa.Engine, revision: str) -> None:
    """Run the migrations up to `revision` (not to the head) on `engine`'s database."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def migrated(url: str, revision: str) -> sa.Engine:
    """An engine on the database at `url`, brought to `revision`."""
    engine = sa.create_engine(url)
    upgrade_to(engine, revision)
    return engine


def store_of_before(url: str, revision: str) -> Store:
    """The database at `url` brought to `revision` with the queue and workload of a store
    of before (OLD_QUEUE, OLD_WORKLOAD) in it, then opened as a Store, which upgrades it
    to the head."""
    engine = migrated(url, revision)
    with engine.begin() as connection:
        connection.execute(sa.text(OLD_QUEUE))
        connection.execute(sa.text(OLD_WORKLOAD))
    engine.dispose()
    return Store(url)
