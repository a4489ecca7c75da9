"""On PostgreSQL a pooled connection is tested before use only after it sat idle (a round
trip saved on every check-out of a busy store), and one that died meanwhile (the server
restarted, or an administrator ended it) is replaced before a request meets it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from corral.store import Store, database


def test_only_an_idle_connection_is_tested_and_a_dead_one_replaced(
    postgres: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = postgres()
    store = Store(url)
    try:
        monkeypatch.setattr(database, "PING_AFTER_SECONDS", 0.2)
        dialect = store.engine.dialect
        real = dialect.do_ping
        pings: list[int] = []

        def counted(connection: Any) -> bool:
            pings.append(connection.info.backend_pid)
            return bool(real(connection))

        monkeypatch.setattr(dialect, "do_ping", counted)
        for _ in range(20):
            assert store.list_nodes() == []
        assert pings == [], "a connection back in use at once was tested"

        # Every other session of this database ends, the pool's among them.
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as admin:
            ended = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert ended is not None and ended[0] >= 1
        time.sleep(0.3)
        for _ in range(5):
            assert store.list_nodes() == []
        assert pings, "an idle connection was not tested"
    finally:
        store.close()
