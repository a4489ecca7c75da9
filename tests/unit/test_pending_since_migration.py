"""Migration 0006_ux on a store made by 0003_memberships: workloads of before get no
`pending_since`, and so wait from their submission."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from corral.store import Store
from migration_support import OLD_QUEUE, OLD_WORKLOAD, migrated


def test_a_store_of_0003_memberships_is_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = migrated(url, "0003_memberships")
    with engine.begin() as connection:
        run = connection.execute
        run(sa.text(OLD_QUEUE))
        run(sa.text(OLD_WORKLOAD))
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
