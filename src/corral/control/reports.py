"""Agents' reports to the store, many per transaction.

Agents report every task that starts or ends and heartbeat every node; at 1,000 nodes a
transaction (an fsync) per report held the write lock most of the time. A report is
therefore queued and the caller goes on; one writer thread takes everything queued and
writes it in one transaction (`Store.write_reports`), in the order it arrived. `flush`
waits until what was queued before it is written: the reconciler calls it between
reading what the agents run and reading what the store binds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from corral.store import Store
from corral.store.reports import Outcome, Report

log = logging.getLogger("corral.reports")
# At most this many reports in one transaction, so that the write lock is not held long.
BATCH = 1000


class ReportWriter:
    """Reports queued by `put`, written in batches by one thread; `done` is called with
    each batch's outcome."""

    def __init__(self, store: Store, done: Callable[[Outcome], None]) -> None:
        self.store = store
        self.done = done
        self._queued: list[Report] = []
        self._put = 0
        self._written = 0
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def put(self, report: Report) -> None:
        """Queue a report; it is written soon, after those queued before it."""
        with self._changed:
            if self._stopping:
                stopped = True
            else:
                stopped = False
                self._queued.append(report)
                self._put += 1
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="corral-reports", daemon=True
                    )
                    self._thread.start()
                self._changed.notify_all()
        if stopped:
            # The writer has ended (the server is stopping): written here and now.
            self._write([report])

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every report queued before this call is written."""
        with self._changed:
            target = self._put
            self._changed.wait_for(lambda: self._written >= target, timeout)

    def stop(self) -> None:
        """Write what is queued, then end the writer."""
        with self._changed:
            self._stopping = True
            thread = self._thread
            self._changed.notify_all()
        if thread is not None:
            thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._queued) or self._stopping)
                batch, self._queued = self._queued[:BATCH], self._queued[BATCH:]
                if not batch:
                    return
            try:
                self._write(batch)
            finally:
                with self._changed:
                    self._written += len(batch)
                    self._changed.notify_all()

    def _write(self, batch: list[Report]) -> None:
        try:
            outcome = self.store.write_reports(batch)
        except Exception:
            if len(batch) == 1:
                # Lost like a message that did not arrive: the reconciler heals it.
                log.exception("writing a report failed: %s", batch[0])
                return
            # Each alone, so that one report the store refuses loses no other.
            for report in batch:
                self._write([report])
            return
        try:
            self.done(outcome)
        except Exception:
            log.exception("acting on reports failed")
