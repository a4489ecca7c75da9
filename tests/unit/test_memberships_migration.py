"""Migration 0003_memberships (0005_memberships.py, after 0003 and 0003_audit) on a store
made by 0002: a user's project becomes a membership, their tokens survive, and workloads
of before read with no secrets."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from corral.store import Store
from corral.store.accounts import digest
from corral.store.database import MIGRATIONS


def test_a_store_of_0002_is_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0002")
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
                "INSERT INTO users (id, name, role, project_id, created_at) VALUES"
                " (1, 'root', 'admin', NULL, 0), (2, 'alice', 'member', 1, 0)"
            )
        )
        run(
            sa.text("INSERT INTO tokens (id, user_id, digest, created_at) VALUES (1, 2, :d, 0)"),
            {"d": digest("crl_alice")},
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
        users = {user.name: user for user in store.list_users()}
        assert users["alice"].memberships == (("team", "member"),)
        assert users["alice"].project == "team"
        assert users["root"].memberships == ()
        alice = store.authenticate("crl_alice")
        assert alice is not None and alice.projects == frozenset({"team"})
        assert store.get_workload("old").spec.secrets == {}
    finally:
        store.close()
