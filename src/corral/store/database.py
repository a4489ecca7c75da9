"""The database under the store: engine, sessions, migrations, the write lock.

SQLite (WAL mode, full fsync) is the embedded default; PostgreSQL is used by URL. Every
change runs in one transaction under one process-wide write lock (`write`), so that the
scheduler loop and API requests never interleave half-done changes. `read`, `write` and
`writing` are the seam the store's modules (usage, telemetry, rules) work through.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("corral.store")

MIGRATIONS = Path(__file__).parent / "migrations"
# How many generations remember which workloads their change touched (`changed_since`).
JOURNAL = 4096
# PostgreSQL plans by statistics that autovacuum refreshes about once a minute. A burst
# of submissions outgrows them in seconds, and plans made from them filter the whole
# table by each name (at 50,000 workloads a name lookup of a batch took 0.5 s, not 5 ms).
# The store refreshes them itself when the tables it grows have grown by this fraction
# since it last did, and by at least `ANALYZE_ROWS` workloads.
ANALYZE_GROWTH = 0.2
ANALYZE_ROWS = 1000
_GROWN = ("workloads", "task_groups")


def database_url(data_dir: Path | None, url: str | None) -> str:
    """The SQLAlchemy URL for `--db URL`, or the embedded SQLite file in `data_dir`."""
    if url:
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            return "postgresql+psycopg://" + url.split("://", 1)[1]
        return url
    if data_dir is None:
        raise ValueError("either a data directory or a database URL is needed")
    return f"sqlite:///{data_dir / 'corral.db'}"


class Database:
    """A migrated database with its sessions and its write lock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self.engine: Engine = create_engine(
            url,
            pool_pre_ping=not self.sqlite,
            json_serializer=json_text,
            json_deserializer=orjson.loads,
            **({"connect_args": {"check_same_thread": False}} if self.sqlite else {}),
        )
        if self.sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        # Session events (see corral.store.usage) are installed on this factory, so that
        # they apply to this database's sessions only.
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_lock = threading.RLock()
        # Counts committed changes that scheduling depends on (see `write`).
        self.generation = 0
        # Generation -> the only workloads its change touched, or None when it may have
        # touched anything (see `changed_since`).
        self._journal: dict[int, frozenset[str] | None] = {}
        # Workloads added since the planner's statistics were last refreshed, and how
        # many it counted then (see `grew`).
        self._growth_lock = threading.Lock()
        self._grown = 0
        self._analyzed = 0.0
        self.migrate()

    def migrate(self) -> None:
        """Bring the schema to the newest migration."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the write lock across several calls (the scheduler's cycle does)."""
        with self._write_lock:
            yield

    @contextmanager
    def write(
        self, relevant: bool = True, touched: Collection[str] | None = None
    ) -> Iterator[Session]:
        """One transaction under the write lock. A `relevant` change (the default) is one
        that can make a scheduling cycle computed before it wrong: it bumps `generation`
        once committed. `touched`: the names of the only workloads the change can alter
        (no node, queue or other workload), which lets the scheduler re-read just those."""
        with self._write_lock:
            with self.sessions.begin() as session:
                yield session
            if relevant:
                self.bump(touched)

    def bump(self, touched: Collection[str] | None = None) -> None:
        """Count a committed relevant change; call it under the write lock. `touched` as
        for `write`; None: the change may have altered anything."""
        generation = self.generation + 1
        # Journaled before the generation moves: a reader that sees the new generation
        # finds its entry (or none, which reads as "anything").
        self._journal[generation] = None if touched is None else frozenset(touched)
        self._journal.pop(generation - JOURNAL, None)
        self.generation = generation

    def changed_since(self, then: int, now: int) -> frozenset[str] | None:
        """The workloads the relevant changes after generation `then` up to `now` touched,
        when every one of them named its workloads; None when any may have altered more
        (or is too old to be remembered)."""
        if now - then >= JOURNAL or now < then:
            return None
        names: set[str] = set()
        for generation in range(then + 1, now + 1):
            touched = self._journal.get(generation)
            if touched is None:
                return None
            names |= touched
        return frozenset(names)

    def grew(self, workloads: int) -> None:
        """Count `workloads` new workloads committed (with their task groups). On
        PostgreSQL, refresh the planner's statistics of their tables once they have grown
        enough (`ANALYZE_GROWTH`). Call it outside the write lock: ANALYZE blocks no
        writer, and should not make writers wait."""
        if self.sqlite or workloads <= 0:
            return
        with self._growth_lock:
            self._grown += workloads
            if self._grown < max(ANALYZE_ROWS, ANALYZE_GROWTH * self._analyzed):
                return
            self._grown = 0
        # The workloads are committed: a failure here fails no submission, and the next
        # one tries again.
        try:
            with self.engine.connect() as connection:
                connection.execute(text(f"ANALYZE {', '.join(_GROWN)}"))
                counted = connection.execute(
                    text("SELECT reltuples FROM pg_class WHERE relname = 'workloads'")
                ).scalar()
                connection.commit()
        except SQLAlchemyError as error:
            log.warning("could not refresh the planner's statistics: %s", error)
            with self._growth_lock:
                self._grown += ANALYZE_ROWS
            return
        self._analyzed = max(float(counted or 0.0), 0.0)

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reading; it changes nothing and takes no lock."""
        with self.sessions() as session:
            yield session


def json_text(value: Any) -> str:
    """A JSON column's value as text, as json.dumps would write it but for the spaces
    (keys that are not strings become strings, as json.dumps makes them): how SQLAlchemy
    writes JSON columns here, and how rows written without it (`corral.store.bulk`) give
    them. None is the JSON null, as SQLAlchemy writes it."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # FULL: a transaction that returned is on disk, even if the machine loses power.
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()
