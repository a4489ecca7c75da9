"""Group commit from the event loop to the store.

A write must be on disk before the API answers it, and a commit (an fsync) costs
milliseconds. A handler therefore does not write: it queues its item and awaits a future.
One writer thread takes everything queued, writes it in one transaction, and settles the
futures in one call into each event loop. Under load a commit carries as many items as
arrived while the previous one was being written; alone, an item waits for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class _Waiting(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    loop: asyncio.AbstractEventLoop


class GroupWriter(Generic[T, R]):
    """Items queued by `put`, written in batches by one thread with `write`, which gives
    for each item its result or the exception to raise to its caller."""

    def __init__(
        self,
        name: str,
        write: Callable[[list[T]], Sequence[R | Exception]],
        settled: Callable[[Sequence[R | Exception]], None] | None = None,
    ) -> None:
        self.name = name
        self.write = write
        # Called with a batch's outcomes once its callers have been handed them.
        self.settled = settled
        # Appended by the event loops, taken by the writer: a deque's append and popleft
        # are atomic, so the writer takes a batch without the lock, which only orders
        # puts against `stop` (and an idle lock costs a put next to nothing).
        self._queued: deque[_Waiting[T, R]] = deque()
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    async def put(self, item: T) -> R:
        """Queue `item`; returns its result once its batch is written, or raises its error.
        A caller cancelled meanwhile (its client went away) does not take the item back:
        it is written all the same."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        with self._lock:
            if self._stopping:
                raise RuntimeError("the server is stopping")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._queued.append(_Waiting(item, future, loop))
        self._ready.set()
        return await future

    def stop(self) -> None:
        """Write what is queued, then end the writer."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._ready.set()
        if thread is not None:
            thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            stopping = self._stopping
            batch = self._take()
            if batch:
                self._write(batch)
            if stopping and not self._queued:
                return

    def _take(self) -> list[_Waiting[T, R]]:
        """Everything queued now, oldest first."""
        queued = self._queued
        return [queued.popleft() for _ in range(len(queued))]

    def _write(self, batch: list[_Waiting[T, R]]) -> None:
        outcomes = self.write([waiting.item for waiting in batch])
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Waiting[T, R], R | Exception]]] = {}
        for waiting, outcome in zip(batch, outcomes, strict=True):
            by_loop.setdefault(waiting.loop, []).append((waiting, outcome))
        for loop, settled in by_loop.items():
            # A closed loop has nobody waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, settled)
        if self.settled is not None:
            self.settled(outcomes)


def _settle(settled: list[tuple[_Waiting[T, R], R | Exception]]) -> None:
    for waiting, outcome in settled:
        if waiting.future.done():
            continue
        if isinstance(outcome, Exception):
            waiting.future.set_exception(outcome)
        else:
            waiting.future.set_result(outcome)
