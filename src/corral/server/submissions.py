"""Submissions from the event loop to the store, in batches.

A submission must be on disk before the API answers it, and a commit (an fsync) costs
milliseconds. The API's submit handler therefore does not write: it queues the workload
and awaits a future. One writer thread takes everything queued, writes it in one
transaction (`Store.submit_many`), wakes the scheduler once, and settles the futures in
one call into the event loop. Under load a commit carries as many submissions as arrived
while the previous one was being written; alone, a submission waits for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from corral.model.spec import WorkloadSpec
from corral.store import Store, WorkloadRecord

log = logging.getLogger("corral.submissions")
Outcome = WorkloadRecord | Exception


@dataclass(slots=True)
class _Waiting:
    spec: WorkloadSpec
    future: asyncio.Future[WorkloadRecord]
    loop: asyncio.AbstractEventLoop


class Submissions:
    def __init__(self, store: Store, written: Callable[[], None]) -> None:
        self.store = store
        # Called after each batch that was written (the scheduler's trigger).
        self.written = written
        self._queued: list[_Waiting] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    async def submit(self, spec: WorkloadSpec) -> WorkloadRecord:
        """Write `spec` as a pending workload; returns it once committed, or raises what
        `Store.submit` would."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[WorkloadRecord] = loop.create_future()
        with self._lock:
            if self._stopping:
                raise RuntimeError("the server is stopping")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="corral-submissions", daemon=True
                )
                self._thread.start()
            self._queued.append(_Waiting(spec, future, loop))
        self._ready.set()
        # Shielded: a client that goes away does not take back a submission being written.
        return await asyncio.shield(future)

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
            with self._lock:
                batch, self._queued = self._queued, []
                stopping = self._stopping
            if batch:
                self._write(batch)
            if stopping:
                with self._lock:
                    if not self._queued:
                        return

    def _write(self, batch: list[_Waiting]) -> None:
        outcomes: list[Outcome]
        try:
            outcomes = self.store.submit_many([waiting.spec for waiting in batch])
        except Exception as error:  # the store failed as a whole: every one gets it
            log.exception("writing %d submissions failed", len(batch))
            outcomes = [error] * len(batch)
        if any(not isinstance(outcome, Exception) for outcome in outcomes):
            self.written()
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Waiting, Outcome]]] = {}
        for waiting, outcome in zip(batch, outcomes, strict=True):
            by_loop.setdefault(waiting.loop, []).append((waiting, outcome))
        for loop, settled in by_loop.items():
            # A closed loop has nobody waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, settled)


def _settle(settled: list[tuple[_Waiting, Outcome]]) -> None:
    for waiting, outcome in settled:
        if waiting.future.done():
            continue
        if isinstance(outcome, Exception):
            waiting.future.set_exception(outcome)
        else:
            waiting.future.set_result(outcome)
