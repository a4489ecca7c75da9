"""The store's locks, and the one order in which they are taken.

Every change to the store runs under the write lock, which holds between processes (the
server's API and its scheduler are two). On PostgreSQL new workloads are added under a
lock of their own, the lock of new work, so that a scheduling cycle writing its
decisions and a submission do not wait for each other. A writer takes, in this order:

1. the write lock's thread lock: one thread of this process at a time (`Held`), taken
   again by the thread that holds it without waiting;
2. the write lock between processes (`write_lock`): a lock file beside a SQLite
   database (flock(2), `FileLock`), an advisory lock on PostgreSQL (`AdvisoryLock`);
3. the lock of new work, on PostgreSQL: again a thread lock, then an advisory lock of its
   own (on SQLite, one writer at a time in any case, the write lock is new work's too);
4. the database's own locks, in the transaction (SQLite's lock of its file, PostgreSQL's
   row locks).

Who takes which (`Locks`): every writer takes 1 to 4; a scheduling cycle 1, 2 and 4, not
the lock of new work (it reads and writes only work it read before, and no row that
adding work writes or reads to check it); adding new work (submissions, audit records)
3 and 4 alone. Nothing is ever taken in the other order: a thread that holds the lock
of new work and asks for the write lock could wait for ever for a writer that holds the
write lock and waits for new work's, so `Locks.writing` refuses it (RuntimeError). Each
lock between processes is released by the kernel or the database server when its
process ends, however it ends.

Apart from these, `Database.grew` counts new rows under a thread lock of its own, taken
outside the write lock and holding no other.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

# The PostgreSQL advisory locks that are the write lock and the lock of new work across
# processes (numbers that no other user of corral's database takes).
ADVISORY_KEY = 0x636F7272616C  # "corral"
NEW_WORK_KEY = ADVISORY_KEY + 1


class Lock(Protocol):
    """A lock between processes."""

    # A connection that holds the lock, for reads under it (None: the lock has none).
    connection: Connection | None

    def acquire(self) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class Locks:
    """The write lock and the lock of new work of one database, taken in their order."""

    def __init__(self, engine: Engine) -> None:
        # The write lock: one thread of this process at a time, and then one process.
        self.write = Held(write_lock(engine))
        # The lock of new workloads, on PostgreSQL; on SQLite, which has one writer at a
        # time in any case, the write lock is theirs too.
        self.split = engine.dialect.name == "postgresql"
        self.new_work = Held(AdvisoryLock(engine, NEW_WORK_KEY) if self.split else NoLock())

    @contextmanager
    def writing(self, beside_new_work: bool = False) -> Iterator[bool]:
        """Hold the write lock, and then the lock of new work unless `beside_new_work` (a
        scheduling cycle). True to the outermost hold of the write lock."""
        me = threading.get_ident()
        if self.new_work.holder == me and self.write.holder != me:
            # The other order is every writer's: this one could wait for it for ever.
            raise RuntimeError("the write lock is taken after the lock of new work")
        with self.write.held() as first:
            if beside_new_work or not self.split:
                yield first
            else:
                with self.new_work.held():
                    yield first

    @contextmanager
    def adding(self) -> Iterator[bool]:
        """Hold the lock of new work: on PostgreSQL its own, on SQLite the write lock. True
        to the outermost hold of the write lock (never on PostgreSQL)."""
        if not self.split:
            with self.writing() as first:
                yield first
            return
        with self.new_work.held():
            yield False

    def close(self) -> None:
        """Close the locks' own connections and files."""
        self.write.across.close()
        self.new_work.across.close()


class Held:
    """A lock across processes (`across`) held by one thread of this process at a time,
    again and again within its hold: the outermost hold takes `across` and lets it go."""

    def __init__(self, across: Lock) -> None:
        self.across = across
        # The thread that holds it, or None.
        self.holder: int | None = None
        self._lock = threading.RLock()
        self._depth = 0

    @contextmanager
    def held(self) -> Iterator[bool]:
        """Hold it; True to the outermost hold."""
        with self._lock:
            first = self._depth == 0
            if first:
                self.across.acquire()
                self.holder = threading.get_ident()
            self._depth += 1
            try:
                yield first
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.holder = None
                    self.across.release()


def write_lock(engine: Engine) -> Lock:
    """The write lock between processes on `engine`'s database."""
    if engine.dialect.name == "postgresql":
        return AdvisoryLock(engine, ADVISORY_KEY)
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        return FileLock(Path(f"{database}-lock"))
    # A database only this process can open.
    return NoLock()


class FileLock:
    """flock(2) on a file beside the SQLite database: released by the kernel when its
    process ends, however it ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connection: Connection | None = None
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is None:
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            self._fd = os.open(self.path, flags, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def release(self) -> None:
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class AdvisoryLock:
    """A PostgreSQL session-level advisory lock on a connection of its own: released by
    the server when that connection ends, however its process ends."""

    def __init__(self, engine: Engine, key: int) -> None:
        self.engine = engine
        self.key = key
        self.connection: Connection | None = None

    def acquire(self) -> None:
        if self.connection is None:
            # Outside any transaction: the lock is the session's, and an open
            # transaction would hold back vacuum for as long as the server runs.
            self.connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            self.connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": self.key})
        except SQLAlchemyError:
            # A connection that broke is dropped: the next write opens another.
            self.close()
            raise

    def release(self) -> None:
        assert self.connection is not None
        self.connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


class NoLock:
    """No lock: a database only this process can open, or (the lock of new work on
    SQLite) a lock that another already is."""

    connection: Connection | None = None

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass
