"""The scheduler loop: store -> snapshot -> engine.schedule() -> decisions -> store -> agents.

It runs every `interval` seconds, and at once when woken by a submission, a completion or
a quota change; wake-ups that arrive while a cycle runs are coalesced into the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from corral.engine import schedule
from corral.model import Decisions, SchedulerConfig
from corral.server.metrics import SchedulerMetrics
from corral.store import Store
from corral.store.records import Release

log = logging.getLogger("corral.scheduler")


class SchedulerLoop:
    def __init__(
        self,
        store: Store,
        config: SchedulerConfig | None = None,
        interval: float = 1.0,
    ) -> None:
        self.store = store
        self.config = config or SchedulerConfig()
        # Called after a cycle that changed something, to tell the agents.
        self.on_changes: Callable[[Decisions, list[Release]], None] | None = None
        self.interval = interval
        self.last: Decisions | None = None
        self.last_at: float | None = None
        self.last_seconds: float | None = None
        self.cycles = 0
        self.metrics = SchedulerMetrics()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def trigger(self) -> None:
        """Ask for a cycle as soon as possible."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="corral-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run_cycle(self) -> Decisions:
        """One cycle; the write lock is held from snapshot to commit, so that nothing the
        decisions depend on changes in between."""
        started = time.perf_counter()
        with self.store.writing():
            snapshot = self.store.snapshot()
            decisions = schedule(snapshot, self.config)
            releases = self.store.apply(decisions)
        self.last = decisions
        self.last_at = time.time()
        self.last_seconds = time.perf_counter() - started
        self.cycles += 1
        self.metrics.cycle_done(self.last_seconds, decisions)
        if self.on_changes is not None and decisions.changed:
            self.on_changes(decisions, releases)
        return decisions

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_cycle()
            except Exception:
                # A failed cycle changed nothing (its transaction rolled back); the next
                # one starts from the store again.
                log.exception("scheduling cycle failed")
