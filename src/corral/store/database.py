"""The database under the store: engine, sessions, migrations, the write lock.

SQLite (WAL mode, full fsync) is the embedded default; PostgreSQL is used by URL. Every
change runs in one transaction under one write lock (`write`), so that the scheduler and
API requests never interleave half-done changes. The lock holds across processes (the
server's API and its scheduler are two). So does the store's generation, the count of
changes that scheduling depends on, kept in the database with the names of what each
change touched (`bump`, `changed_since`). `read`, `write` and `writing` are the seam the
store's modules (usage, telemetry, rules) work through.

On PostgreSQL new workloads are added under a lock of their own (`adding`), which every
other writer takes too, except the scheduler's cycle: a cycle and a submission write no
row in common, so neither waits for the other. The locks, and the one order in which
they are taken, are corral.store.locks'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import orjson
from sqlalchemy import (
    Connection,
    Engine,
    Table,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from corral.store.locks import Locks
from corral.store.schema import ChangeRow

log = logging.getLogger("corral.store")

MIGRATIONS = Path(__file__).parent / "migrations"
# How many generations remember which workloads their change touched (`changed_since`),
# and how often the older ones are forgotten.
JOURNAL = 4096
_FORGET_EVERY = 64
# PostgreSQL plans by statistics that autovacuum refreshes about once a minute. A burst
# of submissions outgrows them in seconds, and plans made from them filter the whole
# table by each name (at 50,000 workloads a name lookup of a batch took 0.5 s, not 5 ms).
# The store refreshes them itself when the tables it grows have grown by this fraction
# since it last did, and by at least `ANALYZE_ROWS` workloads.
ANALYZE_GROWTH = 0.2
ANALYZE_ROWS = 1000
# How long closing the store waits for a refresh under way.
ANALYZE_WAIT_SECONDS = 30.0
_GROWN = ("workloads", "task_groups")
# On PostgreSQL a pooled connection is tested (one round trip) before it is used only when
# it sat in the pool longer than this: a server restarted meanwhile, or a connection an
# idle timeout closed, is then found and replaced before a request meets it. Testing
# every check-out (SQLAlchemy's pool_pre_ping) cost a scheduling cycle five round trips,
# over a millisecond; a connection back in use within a second was alive a moment ago.
PING_AFTER_SECONDS = 1.0

_CHANGES = cast(Table, ChangeRow.__table__)
_NEWEST = select(func.max(_CHANGES.c.generation))
_JOURNAL_ONE = insert(_CHANGES)
_FORGET = delete(_CHANGES).where(_CHANGES.c.generation <= bindparam("oldest"))
_SINCE = (
    select(_CHANGES.c.touched)
    .where(_CHANGES.c.generation > bindparam("then"), _CHANGES.c.generation <= bindparam("now"))
    .order_by(_CHANGES.c.generation)
)


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
    """A migrated database with its sessions and its write lock. `migrate`: bring the
    schema to the newest migration first (a second process on a database the server
    opened, its scheduler, does not)."""

    def __init__(self, url: str, migrate: bool = True) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self.engine: Engine = create_engine(
            url,
            json_serializer=json_text,
            json_deserializer=orjson.loads,
            **({"connect_args": {"check_same_thread": False}} if self.sqlite else {}),
        )
        if self.sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            _ping_when_idle(self.engine)
        # Session events (see corral.store.usage) are installed on this factory, so that
        # they apply to this database's sessions only.
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Reads on PostgreSQL run outside a transaction: in its default isolation (read
        # committed) each statement sees the database as of its own start whether or not
        # a transaction holds it, and the BEGIN and ROLLBACK around a read were two round
        # trips more for each (a scheduling cycle reads three to five times before it
        # writes). SQLite's driver begins no transaction for a read in any case.
        self.reader: Engine = (
            self.engine
            if self.sqlite
            else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        )
        self._reads = sessionmaker(self.reader, expire_on_commit=False)
        # The write lock and the lock of new work (`adding`), in their order.
        self.locks = Locks(self.engine)
        # While this process holds the lock, no other moves the generation: the thread
        # that holds it reads it once and counts its own changes (see `generation`).
        self._held_generation: int | None = None
        # Workloads added since the planner's statistics were last refreshed, and how
        # many it counted then (see `grew`).
        self._growth_lock = threading.Lock()
        self._grown = 0
        self._analyzed = 0.0
        self._analyzer: threading.Thread | None = None
        if migrate:
            self.migrate()

    def migrate(self) -> None:
        """Bring the schema to the newest migration."""
        # Imported here: a process that opens a migrated database needs none of it.
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def close(self) -> None:
        """Close every pooled connection, and the write lock's (after a refresh of the
        planner's statistics under way, if any)."""
        analyzer = self._analyzer
        if analyzer is not None:
            analyzer.join(timeout=ANALYZE_WAIT_SECONDS)
        self.locks.close()
        self.engine.dispose()

    @contextmanager
    def writing(self, beside_new_work: bool = False) -> Iterator[None]:
        """Hold the write lock across several calls (the scheduler's cycle does): no
        other thread, and no other process, writes meanwhile. `beside_new_work`: new
        workloads may be added meanwhile (on PostgreSQL; see `holding_new_work`), for a
        scheduling cycle, which reads and writes only the work it read before (by id up to
        the newest it read) and no row that adding work writes or reads to check it."""
        with self.locks.writing(beside_new_work) as first:
            if first:  # what an earlier holder counted is not this one's to trust
                self._held_generation = None
            yield

    @contextmanager
    def adding(self) -> Iterator[Session]:
        """One transaction that adds new workloads (with their task groups, events, audit
        records and Idempotency-Keys), or audit records alone, and changes nothing else,
        under the lock of new work (`holding_new_work`)."""
        with self.holding_new_work():
            if self.locks.split:
                with self.sessions.begin() as session:
                    yield session
            else:
                with self.write(relevant=False) as session:
                    yield session

    @contextmanager
    def holding_new_work(self) -> Iterator[None]:
        """Hold the lock under which new workloads are added, across several calls (a batch
        of submissions written again one by one does, `Store.submit_many`). On PostgreSQL
        it is a lock of its own, which every writer takes after the write lock but a
        scheduling cycle does not (`writing`): new work is committed one transaction at a
        time, so in the order of its ids (a cycle reads new work by id, after the newest
        it read), and no other change undoes its checks meanwhile; but a cycle writing
        its bindings does not hold it up, nor it a cycle. On SQLite, the write lock."""
        with self.locks.adding() as first:
            if first:  # on SQLite, the write lock: as in `writing`
                self._held_generation = None
            yield

    @contextmanager
    def write(
        self,
        relevant: bool = True,
        touched: Collection[str] | None = None,
        beside_new_work: bool = False,
    ) -> Iterator[Session]:
        """One transaction under the write lock. A `relevant` change (the default) is one
        that can make a scheduling cycle computed before it wrong: it moves `generation`
        in the same transaction. `touched`: the names of the only workloads the change
        can alter (no node, queue or other workload), which lets the scheduler re-read
        just those. `beside_new_work` as for `writing`."""
        with self.writing(beside_new_work):
            try:
                with self.sessions.begin() as session:
                    yield session
                    if relevant:
                        self.bump(session, touched)
            except BaseException:
                # Rolled back: a generation counted in it did not happen.
                self._held_generation = None
                raise

    @property
    def generation(self) -> int:
        """How many relevant changes have committed (by any process), as of now; to the
        thread that holds the write lock, with those of its own transaction."""
        if self.locks.write.holder == threading.get_ident():
            if self._held_generation is None:
                # On the lock's own connection where it has one: no round trips to take
                # another from the pool.
                held = self.locks.write.across.connection
                self._held_generation = (
                    _newest(held) if held is not None else self._read_generation()
                )
            return self._held_generation
        return self._read_generation()

    def _read_generation(self) -> int:
        with self.reader.connect() as connection:
            return _newest(connection)

    def bump(self, session: Session, touched: Collection[str] | None = None) -> int:
        """Count a relevant change in the transaction of `session`, which holds the write
        lock (see `write`), and return the generation it makes. `touched` as for `write`;
        None: the change may have altered anything."""
        generation = self.generation + 1
        names = None if touched is None else sorted(touched)
        connection = session.connection()
        connection.execute(_JOURNAL_ONE, {"generation": generation, "touched": names})
        if generation % _FORGET_EVERY == 0:
            connection.execute(_FORGET, {"oldest": generation - JOURNAL})
        self._held_generation = generation
        return generation

    def changed_since(self, then: int, now: int) -> frozenset[str] | None:
        """The workloads the relevant changes after generation `then` up to `now` touched,
        when every one of them named its workloads; None when any may have altered more
        (or is too old to be remembered)."""
        if now - then >= JOURNAL or now < then:
            return None
        if now == then:
            return frozenset()
        with self.reader.connect() as connection:
            journal = connection.execute(_SINCE, {"then": then, "now": now}).scalars().all()
        if len(journal) != now - then:
            return None
        names: set[str] = set()
        for touched in journal:
            if touched is None:
                return None
            names.update(touched)
        return frozenset(names)

    def grew(self, workloads: int) -> None:
        """Count `workloads` new workloads committed (with their task groups). On
        PostgreSQL, once they have grown enough (`ANALYZE_GROWTH`), refresh the planner's
        statistics of their tables on a thread of its own: ANALYZE blocks no writer, and
        the caller (a batch's request, the submission writer with the answers of every
        submission it wrote) does not wait for it either. Call it outside the write lock."""
        if self.sqlite or workloads <= 0:
            return
        with self._growth_lock:
            self._grown += workloads
            # One at a time: what grows meanwhile counts towards the next.
            if self._analyzer is not None or self._grown < max(
                ANALYZE_ROWS, ANALYZE_GROWTH * self._analyzed
            ):
                return
            self._grown = 0
            self._analyzer = threading.Thread(
                target=self._analyze, name="corral-analyze", daemon=True
            )
            self._analyzer.start()

    def _analyze(self) -> None:
        # The workloads are committed: a failure here fails no submission, and the next
        # one tries again.
        try:
            with self.engine.connect() as connection:
                connection.execute(text(f"ANALYZE {', '.join(_GROWN)}"))
                counted = connection.execute(
                    text("SELECT reltuples FROM pg_class WHERE relname = 'workloads'")
                ).scalar()
                connection.commit()
            self._analyzed = max(float(counted or 0.0), 0.0)
        except SQLAlchemyError as error:
            log.warning("could not refresh the planner's statistics: %s", error)
            with self._growth_lock:
                self._grown += ANALYZE_ROWS
        finally:
            with self._growth_lock:
                self._analyzer = None

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reading; it changes nothing and takes no lock (nor, on
        PostgreSQL, a transaction: each statement reads what was committed when it began,
        as within one)."""
        with self._reads() as session:
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


def _ping_when_idle(engine: Engine) -> None:
    """Test a pooled connection before use when it was idle for `PING_AFTER_SECONDS`; one
    that fails is thrown away and the pool hands out another (SQLAlchemy's documented
    use of DisconnectionError in a checkout event). A new connection is not tested."""
    dialect = engine.dialect

    def checked_in(_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    def checked_out(connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None or time.monotonic() - since < PING_AFTER_SECONDS:
            return
        try:
            dialect.do_ping(connection)
        except Exception as error:
            raise DisconnectionError(f"a pooled connection did not answer: {error}") from error

    event.listen(engine, "checkin", checked_in)
    event.listen(engine, "checkout", checked_out)


def _newest(connection: Connection) -> int:
    generation: int | None = connection.execute(_NEWEST).scalar()
    return generation or 0
