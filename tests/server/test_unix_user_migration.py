"""Migration 0003: users made before it get the Unix account of their own name, as users
made after it do by default; the first admin gets none. Set through the store, the
account reaches whoever authenticates."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from corral.store import Store
from migration_support import migrated


def test_existing_users_get_their_own_name_and_the_admin_none(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = migrated(url, "0002")
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO users (id, name, role, project_id, created_at) VALUES"
                " (1, 'admin', 'admin', NULL, 0), (2, 'dora', 'viewer', NULL, 0)"
            )
        )
    engine.dispose()
    store = Store(url)
    try:
        accounts = {user.name: user.unix_user for user in store.list_users()}
        assert accounts == {"admin": None, "dora": "dora"}
        store.set_unix_user("admin", "ops")
        token, _ = store.create_token("admin")
        found = store.token_user(token)
        assert found is not None and found[0].unix_user == "ops"
        made, _ = store.create_user("eve", "viewer", None, "eve_unix")
        assert made.unix_user == "eve_unix"
    finally:
        store.close()
