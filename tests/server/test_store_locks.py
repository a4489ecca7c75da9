"""The order of the store's locks (corral.store.locks): every writer takes the write lock,
then the lock of new work, then begins its transaction; a scheduling cycle leaves out the
lock of new work, adding new work the write lock (on PostgreSQL); and the other order is
refused. On SQLite and on PostgreSQL, in this process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

from corral.store import Store
from corral.store.locks import Held


def watched(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Appends what `store` takes and lets go from now on: its locks between processes
    ("write", "new work"), and the beginning of a transaction of its sessions."""
    seen: list[str] = []

    def watch(held: Held, name: str) -> None:
        acquire, release = held.across.acquire, held.across.release

        def acquired() -> None:
            acquire()
            seen.append(f"take {name}")

        def released() -> None:
            seen.append(f"let go {name}")
            release()

        monkeypatch.setattr(held.across, "acquire", acquired)
        monkeypatch.setattr(held.across, "release", released)

    watch(store.locks.write, "write")
    watch(store.locks.new_work, "new work")

    def began(*_args: Any) -> None:
        seen.append("transaction")

    event.listen(store.sessions, "after_begin", began)
    return seen


# What each kind of writer takes and lets go, in order: on SQLite, on PostgreSQL.
WRITE = "take write", "transaction", "let go write"
NEW_WORK = "take new work", "transaction", "let go new work"
TAKEN = {
    # Every writer: the write lock, then new work's (on SQLite the write lock is theirs).
    "writer": (WRITE, ("take write", *NEW_WORK, "let go write")),
    # A scheduling cycle: not the lock of new work.
    "cycle": (WRITE, WRITE),
    # Adding new work: not the write lock, on PostgreSQL.
    "adding": (WRITE, NEW_WORK),
}


@pytest.mark.parametrize("writer", sorted(TAKEN))
def test_each_writer_takes_the_locks_in_their_order(
    store: Store, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    seen = watched(store, monkeypatch)
    if writer == "adding":
        opened = store.adding()
    else:
        opened = store.write(beside_new_work=writer == "cycle")
    with opened as session:
        session.execute(text("SELECT 1"))
    on_sqlite, on_postgresql = TAKEN[writer]
    assert tuple(seen) == (on_sqlite if store.sqlite else on_postgresql)


def test_a_lock_held_is_taken_again_without_waiting(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = watched(store, monkeypatch)
    with store.writing(), store.holding_new_work(), store.writing(), store.holding_new_work():
        pass
    if store.sqlite:
        assert seen == ["take write", "let go write"]
    else:
        assert seen == ["take write", "take new work", "let go new work", "let go write"]


def test_the_write_lock_is_not_taken_under_the_lock_of_new_work(store: Store) -> None:
    # Every writer takes the write lock first: one that took them the other way round
    # could wait for ever for one that holds the write lock and waits for new work's.
    with store.holding_new_work():
        if store.sqlite:  # the same lock there: taken again, as any lock held
            with store.writing():
                pass
        else:
            with (
                pytest.raises(RuntimeError, match="after the lock of new work"),
                store.writing(),
            ):
                pass
            assert store.locks.write.holder is None
    # In their order, both are taken, and the write lock again by its holder.
    with store.writing(), store.holding_new_work(), store.writing():
        pass
    assert store.locks.write.holder is None and store.locks.new_work.holder is None


@pytest.fixture(autouse=True)
def _no_lock_left(store: Store) -> Iterator[None]:
    """A test leaves both locks free, whatever it did."""
    yield
    assert store.locks.write.holder is None
    assert store.locks.new_work.holder is None
