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
# Cycles computed without the lock before one is computed under it.
OPTIMISTIC_ATTEMPTS = 2
# A quiet cluster still gets a cycle this often.
IDLE_CYCLE_SECONDS = 30.0


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
        self._seen_generation = -1
        self._ended = 0.0
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
        """One cycle. The snapshot is read and the engine runs without the write lock, so
        that submissions are not held up; the decisions are written only if nothing they
        depend on changed meanwhile (the store's generation), else the cycle is computed
        again, the last time under the lock."""
        started = time.perf_counter()
        for attempt in range(OPTIMISTIC_ATTEMPTS + 1):
            if attempt == OPTIMISTIC_ATTEMPTS:
                with self.store.writing():
                    decisions, releases = self._decide_and_apply()
                break
            generation = self.store.generation
            snapshot = self.store.snapshot()
            decisions = schedule(snapshot, self.config)
            with self.store.writing():
                if self.store.generation == generation:
                    releases = self.store.apply(decisions)
                    break
        self._seen_generation = self.store.generation
        self._ended = time.monotonic()
        self.last = decisions
        self.last_at = time.time()
        self.last_seconds = time.perf_counter() - started
        self.cycles += 1
        self.metrics.cycle_done(self.last_seconds, decisions)
        if self.on_changes is not None and decisions.changed:
            self.on_changes(decisions, releases)
        return decisions

    def _decide_and_apply(self) -> tuple[Decisions, list[Release]]:
        decisions = schedule(self.store.snapshot(), self.config)
        return decisions, self.store.apply(decisions)

    def _run(self) -> None:
        idle_since = time.monotonic()
        while not self._stop.is_set():
            woken = self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            # A tick with no wake-up and no change since the last cycle would decide the
            # same again: skip it, but not for long (time-based rules read fresh state).
            quiet = not woken and self.store.generation == self._seen_generation
            if quiet and time.monotonic() - idle_since < IDLE_CYCLE_SECONDS:
                continue
            idle_since = time.monotonic()
            # Leave the API at least as much time as the last cycle took: under a burst
            # of submissions, cycles would otherwise run back to back and starve it of
            # the interpreter. The wake-ups that arrive meanwhile share the next cycle.
            rest = (self.last_seconds or 0.0) - (time.monotonic() - self._ended)
            if rest > 0:
                self._stop.wait(min(rest, self.interval))
                self._wake.clear()
            try:
                self.run_cycle()
            except Exception:
                # A failed cycle changed nothing (its transaction rolled back); the next
                # one starts from the store again.
                log.exception("scheduling cycle failed")
