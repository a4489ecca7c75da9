"""The scheduler loop: store -> snapshot -> engine.schedule() -> decisions -> store -> agents.

It runs every `interval` seconds, and at once when woken by a submission, a completion or
a quota change; wake-ups that arrive while a cycle runs are coalesced into the next one,
which then waits `STREAM_REST` times as long as that cycle took (see `_run`).

The loop keeps the snapshot its last cycle left behind (the one it read, with its own
decisions applied), its workloads by name. While the store's generation shows no other
change that a cycle depends on, the next snapshot is that one plus the workloads
submitted since, read by id: a burst of submissions costs each cycle the new work, not
all the work in the store. Changes that name the only workloads they touched (task ends,
see `Database.changed_since`) cost it those workloads, read again and put in their
places; nothing else is looked at one by one. Any other change, and
every `FULL_SNAPSHOT_SECONDS` in any case, reads the whole snapshot again. The engine
likewise keeps the state of running work between cycles (`engine.Scheduler`), so a
cycle loads only the work that started, stopped or changed.
Every `USAGE_SECONDS` the loop also brings the queues' decayed usage up to date in the
store (time-decayed fair share, `corral.store.queue_usage`) from what is bound, and
gives the usage shares to every snapshot until the next time.
With `CORRAL_VERIFY_SNAPSHOTS=1` in the environment (tests/chaos and
tests/agent/test_verified_snapshots.py set it) every incremental snapshot is compared with
a full read and every cycle's decisions with a fresh `engine.schedule()`, and a difference
fails the cycle.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from corral.control.decision_log import log_decisions
from corral.control.metrics import SchedulerMetrics
from corral.engine import Scheduler, decided, schedule
from corral.model import Decisions, Node, Queue, SchedulerConfig, Snapshot, Workload
from corral.store import Store
from corral.store.records import Release

log = logging.getLogger("corral.scheduler")
# Cycles computed without the lock before one is computed under it.
OPTIMISTIC_ATTEMPTS = 2
# Cycles may take this share of the time on average (the API and the agents' reports
# need the interpreter too), and save up at most BUDGET_SECONDS of cycle time while quiet.
# A cycle's time is the CPU time of the thread that runs it: waiting for a commit to
# reach the disk leaves the interpreter to the others. Under a stream of submissions the
# cycles spend all of it (much of a cycle's cost is the running work it carries over,
# however few it binds), so the share is what the stream costs the API; cycles that wait
# longer bind more each.
CYCLE_SHARE = 1 / 5
BUDGET_SECONDS = 0.25
# Woken while it ran, a cycle is followed by a rest this many times as long as it took
# (wall clock), so that while work streams in, cycles take at most a third of the time
# and of the write lock, each binding what arrived meanwhile. Much of a cycle's cost is
# fixed (its round trips to the database, its commit, the lock the submission writer waits
# for meanwhile); run back to back, one per batch of submissions, cycles bound a few
# workloads each, and the API served fewer submissions (docs/control-plane.md gives the
# measurement). A wake-up after a quiet cycle (a submission waited for alone) is served
# at once.
STREAM_REST = 2.0
# A quiet cluster still gets a cycle this often.
IDLE_CYCLE_SECONDS = 30.0
# The longest a cycle goes on from a kept snapshot before reading the store whole (the
# idle flags of running work come from telemetry, which does not move the generation).
FULL_SNAPSHOT_SECONDS = 10.0
# How often the queues' decayed usage is brought up to date; half-lives are hours.
USAGE_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class _LastCycle:
    """The cluster after the last cycle's decisions, valid at `generation`: its nodes and
    queues, and its workloads by name in the store's order (by id), a dict that the next
    cycle changes where the store changed (in place: a cycle costs what changed)."""

    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    workloads: dict[str, Workload]
    generation: int
    newest: int
    read_at: float


@dataclass(frozen=True, slots=True)
class _Read:
    """A cycle's snapshot, its workloads by name (to be kept), the newest workload id in
    it, and when its last full read was made."""

    snapshot: Snapshot
    workloads: dict[str, Workload]
    newest: int
    read_at: float


_NAME = operator.attrgetter("name")


class SchedulerLoop:
    def __init__(
        self,
        store: Store,
        config: SchedulerConfig | None = None,
        interval: float = 1.0,
        share: float = CYCLE_SHARE,
    ) -> None:
        self.store = store
        self.config = config or SchedulerConfig()
        # Called after a cycle that changed something, to tell the agents.
        self.on_changes: Callable[[Decisions, list[Release]], None] | None = None
        # Called after every cycle (corral.control.scheduler_process tells the server).
        self.on_cycle: Callable[[Decisions, list[Release]], None] | None = None
        self.interval = interval
        # The share of the time cycles may take (see `_overdrawn`).
        self.share = share
        self.last: Decisions | None = None
        self._seen_generation = -1
        # Cycle time that may be spent now (see `_overdrawn`).
        self._budget = BUDGET_SECONDS
        self._refilled = time.monotonic()
        self.last_at: float | None = None
        self.last_seconds: float | None = None
        self.cycles = 0
        self.full_snapshots = 0
        self.verify = os.environ.get("CORRAL_VERIFY_SNAPSHOTS", "") not in ("", "0")
        self._kept: _LastCycle | None = None
        # The engine keeps the state of running work from one cycle to the next.
        self._engine = Scheduler()
        # The queues' usage shares (time-decayed fair share), and when they were brought
        # up to date (monotonic clock).
        self.usage: dict[str, float] = {}
        self.usage_seconds = USAGE_SECONDS
        self._usage_at: float | None = None
        self.metrics = SchedulerMetrics()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def shape(self) -> tuple[tuple[Node, ...], tuple[Queue, ...]] | None:
        """The nodes and queues the last cycle saw (None before the first): what a
        submission is checked against without reading the store (corral.control.admission)."""
        kept = self._kept
        return None if kept is None else (kept.nodes, kept.queues)

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
        spent = time.thread_time()
        # Work whose dependencies were met since joins this cycle's snapshot; the engine
        # never sees work that still waits for others (corral.store.lifecycle).
        self.store.resolve_holds()
        self._advance_usage()
        for attempt in range(OPTIMISTIC_ATTEMPTS + 1):
            if attempt == OPTIMISTIC_ATTEMPTS:
                with self.store.writing(beside_new_work=True):
                    read = self._snapshot(self.store.generation)
                    decisions = self._decide(read.snapshot)
                    releases = self.store.apply(decisions)
                    self._keep(read, decisions)
                break
            generation = self.store.generation
            read = self._snapshot(generation)
            decisions = self._decide(read.snapshot)
            with self.store.writing(beside_new_work=True):
                if self.store.generation == generation:
                    releases = self.store.apply(decisions)
                    self._keep(read, decisions)
                    break
        # The generation the cycle's write made (kept with its snapshot): a change after
        # it makes the next tick run a cycle.
        assert self._kept is not None
        self._seen_generation = self._kept.generation
        self._budget -= time.thread_time() - spent
        self.last = decisions
        self.last_at = time.time()
        self.last_seconds = time.perf_counter() - started
        self.cycles += 1
        self.metrics.cycle_done(self.last_seconds, decisions)
        log_decisions(decisions)
        if self.on_changes is not None and decisions.changed:
            self.on_changes(decisions, releases)
        if self.on_cycle is not None:
            self.on_cycle(decisions, releases)
        return decisions

    def _advance_usage(self) -> None:
        """Bring the queues' decayed usage up to date, at most every `usage_seconds`."""
        now = time.monotonic()
        if self._usage_at is not None and now - self._usage_at < self.usage_seconds:
            return
        self.usage = self.store.advance_usage(time.time())
        self._usage_at = now

    def _decide(self, snapshot: Snapshot) -> Decisions:
        decisions = self._engine(snapshot, self.config)
        if self.verify:
            fresh = schedule(snapshot, self.config)
            if decisions != fresh:
                raise AssertionError(
                    f"kept state: the engine decided {decisions}, schedule() decides {fresh}"
                )
        return decisions

    def _snapshot(self, generation: int) -> _Read:
        """The snapshot for a cycle that starts at `generation`: the kept one and what
        changed since, or a full read."""
        kept = self._kept
        changed = (
            self.store.changed_since(kept.generation, generation)
            if kept is not None and time.monotonic() - kept.read_at < FULL_SNAPSHOT_SECONDS
            else None
        )
        if kept is not None and changed is not None:
            workloads = kept.workloads
            # Only these workloads changed since (task ends): read again, in their places.
            # One that was not kept has no known place: the store is read whole then.
            fresh = (
                {w.name: w for w in self.store.named_workloads(changed, kept.newest)}
                if changed
                else {}
            )
            if fresh.keys() <= workloads.keys():
                for name in changed:
                    if name in fresh:
                        workloads[name] = fresh[name]
                    else:
                        workloads.pop(name, None)
                # Newer than every kept one: at the end, in order. (A cycle computed
                # again after a lost race reads them again, in the same places.)
                new, newest = self.store.new_workloads(kept.newest)
                for workload in new:
                    workloads[workload.name] = workload
                snapshot = Snapshot(
                    kept.nodes, kept.queues, tuple(workloads.values()), usage=self.usage
                )
                if self.verify:
                    self._check(snapshot, generation, newest)
                return _Read(snapshot, workloads, newest, kept.read_at)
        read_at = time.monotonic()
        snapshot, newest = self.store.read_snapshot()
        self.full_snapshots += 1
        workloads = dict(zip(map(_NAME, snapshot.workloads), snapshot.workloads, strict=True))
        return _Read(replace(snapshot, usage=self.usage), workloads, newest, read_at)

    def _check(self, snapshot: Snapshot, generation: int, newest: int) -> None:
        # Under the write lock: a write commits and then moves the generation, both while
        # it holds the lock, so a change read here is one the generation already counts.
        with self.store.writing():
            if self.store.generation != generation:
                return  # the store moved on; this cycle will not be written
            full = self.store.snapshot()
        # Idle flags come from telemetry and may lag in a kept snapshot by design, and so
        # do the times work has run for (min-runtime), since its last checkpoint and waited
        # (reservations), until the next full read.
        if full.nodes != snapshot.nodes or full.queues != snapshot.queues:
            raise AssertionError("kept snapshot: nodes or queues differ from the store")
        kept = {w.name: w for w in snapshot.workloads}
        # Submitted after the kept snapshot's read: the next cycle's.
        read = {w.name: w for w in full.workloads if w.submitted <= newest}
        for name in kept.keys() | read.keys():
            a, b = kept.get(name), read.get(name)
            if (
                a is None
                or b is None
                or a
                != replace(
                    b,
                    idle=a.idle,
                    running_for=a.running_for,
                    since_checkpoint=a.since_checkpoint,
                    waiting_for=a.waiting_for,
                )
            ):
                raise AssertionError(f"kept snapshot: {name} differs: {a} != {b}")

    def _keep(self, read: _Read, decisions: Decisions) -> None:
        """Called under the write lock right after `decisions` were written."""
        workloads = read.workloads
        workloads.update(decided(workloads, decisions))
        snapshot = read.snapshot
        self._kept = _LastCycle(
            snapshot.nodes,
            snapshot.queues,
            workloads,
            self.store.generation,
            read.newest,
            read.read_at,
        )

    def _overdrawn(self) -> float:
        """Seconds to rest before the next cycle keeps within its share of the time."""
        now = time.monotonic()
        self._budget = min(BUDGET_SECONDS, self._budget + self.share * (now - self._refilled))
        self._refilled = now
        return max(0.0, -self._budget / self.share)

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
            # Under a stream of submissions, a cycle per wake-up would run back to back
            # and starve the API of the interpreter: cycles spend a budget that refills
            # at their share of the time, and rest while it is overdrawn. Wake-ups that
            # arrive meanwhile share the next cycle. A cluster that was quiet has budget
            # saved up, and a submission is scheduled at once.
            rest = self._overdrawn()
            if rest > 0:
                self._stop.wait(min(rest, self.interval))
                self._wake.clear()
            try:
                self.run_cycle()
            except Exception:
                # A failed cycle changed nothing (its transaction rolled back); the next
                # one starts from the store again.
                log.exception("scheduling cycle failed")
                continue
            if self._wake.is_set() and self.last_seconds is not None:
                # Work streams in: the next cycle takes what arrives meanwhile as well.
                self._stop.wait(min(STREAM_REST * self.last_seconds, self.interval))
