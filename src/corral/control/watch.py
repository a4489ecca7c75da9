"""Requests that wait for a workload to change (GET /workloads/NAME?until=STATUS): woken
when the scheduler binds, evicts or releases it and when its tasks' ends are taken in,
rather than polling the store.

A waiting request holds no thread: it waits on an asyncio event of its own event loop,
set from whichever thread saw the change. A change no one announces (a lost node, a
rule, a cancellation) is still seen: the request reads the store again every
`RECHECK_SECONDS` as well. A user has at most `MAX_WAITING` requests waiting at once; a
request beyond them is answered at once, as a plain read (waiting requests cost little,
but each reads the store every second, and connections are cheap to open).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

# The longest a waiting request goes without reading the store again.
RECHECK_SECONDS = 1.0
# Requests one user may have waiting at once.
MAX_WAITING = 64


class Changes:
    """Who waits for which workload, and the wake-up call for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._by_user: dict[str, int] = {}

    def changed(self, names: Iterable[str]) -> None:
        """These workloads may have changed (from any thread): wake those waiting on them.
        Nobody waiting, `names` is not even gone through (a cycle binds thousands)."""
        with self._lock:
            if not self._waiting:
                return
            woken = [w for name in names for w in self._waiting.get(name, ())]
        for loop, event in woken:
            # A loop closed meanwhile has no one left to wake.
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    @contextmanager
    def watching(self, name: str, user: str) -> Iterator[asyncio.Event | None]:
        """An event set whenever workload `name` may have changed, while in the block;
        it is to be cleared by the caller before each look at the workload. None when
        `user` has MAX_WAITING requests waiting already: this one must not wait."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            full = self._by_user.get(user, 0) >= MAX_WAITING
            if not full:
                self._by_user[user] = self._by_user.get(user, 0) + 1
                self._waiting.setdefault(name, set()).add(entry)
        if full:
            yield None
            return
        try:
            yield entry[1]
        finally:
            with self._lock:
                waiting = self._waiting.get(name)
                if waiting is not None:
                    waiting.discard(entry)
                    if not waiting:
                        del self._waiting[name]
                left = self._by_user[user] - 1
                if left:
                    self._by_user[user] = left
                else:
                    del self._by_user[user]

    def waiting(self) -> int:
        """How many requests wait now."""
        with self._lock:
            return sum(len(entries) for entries in self._waiting.values())
