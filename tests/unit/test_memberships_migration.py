"""Migration 0003_memberships (0005_memberships.py, after 0003 and 0003_audit) on a store
made by 0002: a user's project becomes a membership, their tokens survive, and workloads
of before read with no secrets."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from corral.store import Store
from corral.store.accounts import digest
from migration_support import OLD_QUEUE, OLD_WORKLOAD, migrated


def test_a_store_of_0002_is_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = migrated(url, "0002")
    with engine.begin() as connection:
        run = connection.execute
        run(sa.text(OLD_QUEUE))
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
        run(sa.text(OLD_WORKLOAD))
    engine.dispose()
    store = Store(url)
    try:
        users = {user.name: user for user in store.list_users()}
        assert users["alice"].memberships == (("team", "member"),)
        assert users["alice"].project == "team"
        assert users["root"].memberships == ()
        alice = store.token_user("crl_alice")
        assert alice is not None and alice[0].projects == frozenset({"team"})
        assert store.get_workload("old").spec.secrets == {}
    finally:
        store.close()
