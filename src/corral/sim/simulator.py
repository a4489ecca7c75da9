"""The discrete-event simulation: a virtual clock, arrivals and completions, and
scheduling cycles through the same engine the live scheduler calls (an
`engine.Scheduler`, which keeps the state of running work from one cycle to the next).

Cycles fall on a grid of `cycle_interval` seconds. An event (an arrival, a completion)
asks for a cycle at the next grid time, so events between two grid times share one
cycle; a cycle that bound or evicted something asks for another one interval later, as
the work it evicted may fit elsewhere. Nothing else runs a cycle: an idle clock costs
nothing, and a cycle that `CycleGate` shows cannot change anything is skipped.

With time-decayed fair share on for some queue, the simulation keeps each queue's usage
history on its virtual clock (`sim.usage`) and gives every cycle the usage shares, as
the server does from its store.

A job runs its `duration` of work; with `max_runtime_factor` its max runtime (what
reservations plan with) is that duration times the factor, from each start. Evicted, it
goes back to pending, keeps the progress of its last checkpoint (one every
`checkpoint_interval` seconds of progress) and pays `restart_cost` seconds when it starts
again. A consolidation (a move) is an eviction and a start in the same cycle.

Queues with a min-runtime (`preempt_min_runtime`, `reclaim_min_runtime`, own or
inherited) protect young work: each cycle then tells the engine how long every running
job has run since it last started (`running_for`), and a cycle that changed nothing asks
for another when the first protected job comes of age, since that alone may let a
reclaim through.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from corral.engine.quiet import Amounts, CycleGate, Order, Shape
from corral.model import Decisions, Placement, Queue, Snapshot, TaskGroup, Workload
from corral.sim.errors import SimError
from corral.sim.metrics import (
    BUSY,
    ENTITLED,
    HELD,
    HOUR,
    PENDING,
    RECEIVED,
    ProjectResult,
    Recorder,
    Series,
    SimResult,
    jain,
    sample_interval,
    stats,
)
from corral.sim.policies import POOL_PRIORITY, Setup
from corral.sim.trace import Job, Trace
from corral.sim.usage import UsageHistory

Progress = Callable[[float], None]

# Where the gate may check the decision afterwards, each queue shows at most this many
# pending workloads at first.
_SHOWN_PER_QUEUE = 64


@dataclass(frozen=True, slots=True)
class SimSettings:
    """How the simulation runs; times in seconds of virtual time.

    `horizon` stops the clock early (None: run until no work is left that can run).
    `shortcuts` False runs every requested cycle on every pending workload, for checking
    that skipping quiet cycles and hiding pending work (`CycleGate`) changes nothing.
    `checkpoint_aware` tells the engine each running job's time since its last checkpoint,
    so that it takes the victims that lose the least work (otherwise it sees none, and
    takes the newest). `running_for` tells it how long each running job has run since it
    last started, as the live scheduler does (always so when a queue has a min-runtime);
    without checkpoints, the victims that lose the least are then those that ran least.
    `max_runtime_factor` gives each job a max runtime of its duration times this factor
    (None: no max runtime). When a queue sets `reserve_after`, the engine is told before
    each cycle how long each pending job has waited (since it last became pending) and
    each running job has run (since it last started), for reservations (backfill)."""

    cycle_interval: float = 10.0
    checkpoint_interval: float = 1800.0
    restart_cost: float = 60.0
    sample_interval: float | None = None
    horizon: float | None = None
    shortcuts: bool = True
    checkpoint_aware: bool = False
    running_for: bool = False
    max_runtime_factor: float | None = None


# Task groups and node selector: what the engine weighs of a pending workload it does
# not see.
KindKey = tuple[tuple[TaskGroup, ...], tuple[tuple[str, tuple[str, ...]], ...]]


class _Kind:
    """Pending workloads of one kind: one of them, and how many there are."""

    __slots__ = ("count", "workload")

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.count = 0


class _JobState:
    """A job during the run."""

    __slots__ = (
        "end",
        "first_start",
        "gpus",
        "job",
        "kind",
        "lost",
        "order",
        "pending_since",
        "placed",
        "plain",
        "preemptions",
        "project",
        "queue",
        "request",
        "restart",
        "restarts",
        "run_start",
        "saved",
        "shape",
        "version",
        "workload",
    )

    def __init__(self, job: Job, project: int, workload: Workload) -> None:
        self.job = job
        self.project = project
        self.workload = workload
        self.queue = workload.queue
        self.gpus = job.gpus
        cpu = sum(group.cpu * group.replicas for group in job.task_groups)
        memory = float(sum(group.memory * group.replicas for group in job.task_groups))
        self.request: Amounts = (self.gpus, cpu, memory)
        self.placed: Amounts = self.request
        self.shape: Shape = (self.gpus, workload.priority, workload.preemptible)
        # One group of alike tasks that ask for no CPU or memory (see CycleGate.arrived).
        self.plain = len(job.task_groups) == 1 and cpu == 0 and memory == 0
        self.order: Order = (-workload.priority, workload.submitted, workload.name)
        # Workloads of one kind have the same task shapes for the engine.
        self.kind: KindKey = (job.task_groups, tuple(sorted(workload.node_selector.items())))
        self.saved = 0.0  # progress kept by the last checkpoint (s of work)
        self.run_start = math.nan
        self.pending_since = job.submitted
        self.restart = 0.0  # restart cost paid at the start of the current run
        self.first_start = math.nan
        self.end = math.nan
        self.version = 0
        self.preemptions = 0
        self.restarts = 0.0  # GPU-seconds spent restarting
        self.lost = 0.0  # GPU-seconds of progress thrown away


def simulate(
    setup: Setup,
    trace: Trace,
    quotas: Mapping[str, float],
    settings: SimSettings | None = None,
    progress: Progress | None = None,
) -> SimResult:
    """Replay `trace` under `setup`; `quotas` (GPUs per project) are what fairness and
    usage are measured against. `progress` is called now and then with the virtual time."""
    return Simulation(setup, trace, quotas, settings or SimSettings()).run(progress)


class Simulation:
    """One replay of a trace under one policy."""

    def __init__(
        self, setup: Setup, trace: Trace, quotas: Mapping[str, float], settings: SimSettings
    ) -> None:
        if settings.cycle_interval <= 0:
            raise SimError("settings", "the cycle interval must be positive")
        factor = settings.max_runtime_factor
        if factor is not None and not (math.isfinite(factor) and factor > 0):
            raise SimError("settings", "the max runtime factor must be a positive number")
        self.setup = setup
        self.trace = trace
        self.settings = settings
        self.projects = trace.projects
        self.window = trace.span if trace.span > 0 else 1.0
        self.capacity = float(sum(node.gpus for node in setup.nodes if node.schedulable))
        self.gate = CycleGate(setup.nodes, setup.queues, setup.config.actions)
        self.usage = UsageHistory(setup.queues)
        # The usage shares the current cycle sees (empty with the policy off).
        self.shares: dict[str, float] = {}
        sample = settings.sample_interval or sample_interval(self.window, settings.cycle_interval)
        self.recorder = Recorder(
            [quotas.get(project, 0.0) for project in self.projects],
            self.window,
            sample,
        )
        index = {project: at for at, project in enumerate(self.projects)}
        ordered = sorted(trace.jobs, key=lambda job: (job.submitted, job.name))
        self.jobs = [_JobState(job, index[job.project], self._workload(job)) for job in ordered]
        names = Counter(state.job.name for state in self.jobs)
        duplicate = next((name for name, count in names.items() if count > 1), None)
        if duplicate is not None:
            raise SimError(trace.source, f'job name "{duplicate}" is used twice')
        self.by_name = {state.job.name: state for state in self.jobs}
        # Running workloads, all of which the engine sees, and pending ones.
        self.running: dict[str, Workload] = {}
        self.waiting: dict[str, Workload] = {}
        # Pending workloads by kind: one of them and how many, for the engine to weigh
        # the shapes of those a cycle leaves out.
        self.waiting_kinds: dict[KindKey, _Kind] = {}
        self.completions: list[tuple[float, int, int, _JobState]] = []
        self.sequence = 0
        self.cycles = 0
        self.skipped = 0
        # Pending workloads left out of cycles, summed over cycles; cycles run again whole.
        self.hidden = 0
        self.rechecks = 0
        self.evictions: Counter[str] = Counter()
        # Seconds a job of each queue is protected after it starts (0: not at all).
        self.protection = _protection(setup.queues)
        self.protects = any(seconds > 0 for seconds in self.protection.values())
        # Reservations need waiting and running times, which cost a new workload per job
        # per cycle: told only when some queue reserves.
        self.reserving = any(queue.reserve_after is not None for queue in setup.queues)
        self.tells_running_for = settings.running_for or self.protects or self.reserving

    def _workload(self, job: Job) -> Workload:
        pool = self.setup.pool
        factor = self.settings.max_runtime_factor
        return Workload(
            name=job.name,
            queue=pool or job.project,
            task_groups=job.task_groups,
            priority=POOL_PRIORITY if pool else job.priority,
            preemptible=job.preemptible,
            node_selector={"gpu_model": job.gpu_models} if job.gpu_models else {},
            submitted=job.submitted,
            max_runtime=None if factor is None else max(job.duration * factor, 1.0),
        )

    # -- the loop ----------------------------------------------------------------------

    def run(self, progress: Progress | None = None) -> SimResult:
        began = time.perf_counter()
        interval = self.settings.cycle_interval
        horizon = self.settings.horizon if self.settings.horizon is not None else math.inf
        jobs = self.jobs
        arrivals = 0
        due = math.inf
        now = 0.0
        report_every = self.window / 200
        next_report = 0.0
        while True:
            next_arrival = jobs[arrivals].job.submitted if arrivals < len(jobs) else math.inf
            next_completion = self._next_completion()
            now = min(next_arrival, next_completion, due)
            if now == math.inf or now > horizon:
                break
            self.recorder.advance(now)
            if next_completion == now:
                self._complete(heapq.heappop(self.completions)[3], now)
                if self.waiting:
                    due = min(due, _grid(now, interval))
            elif next_arrival == now:
                self._arrive(jobs[arrivals])
                arrivals += 1
                due = min(due, _grid(now, interval))
            else:
                due = interval + now if self._cycle(now) else self._coming_of_age(now)
            if progress is not None and now >= next_report:
                progress(now)
                next_report = now + report_every
        # Stopped by the horizon, the run ends there; otherwise at its last event.
        end = horizon if now > horizon else self.recorder.now
        self.recorder.advance(end)
        return self._result(end, time.perf_counter() - began)

    def _next_completion(self) -> float:
        heap = self.completions
        while heap and heap[0][2] != heap[0][3].version:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    # -- events ------------------------------------------------------------------------

    def _arrive(self, state: _JobState) -> None:
        self._to_pending(state)

    def _to_pending(self, state: _JobState) -> None:
        state.pending_since = self.recorder.now
        self.waiting[state.job.name] = state.workload
        kind = self.waiting_kinds.get(state.kind)
        if kind is None:
            kind = self.waiting_kinds[state.kind] = _Kind(state.workload)
        kind.count += 1
        self.gate.arrived(state.queue, state.shape, state.request, state.order, state.plain)
        self.recorder.change(state.project, pending=state.gpus)

    def _complete(self, state: _JobState, now: float) -> None:
        state.end = now
        state.restarts += state.restart * state.gpus
        self._stop(state, now)

    def _stop(self, state: _JobState, now: float) -> None:
        self.usage.change(state.queue, -state.placed[0], now)
        del self.running[state.job.name]
        self.gate.stopped(state.queue, state.shape, state.placed)
        held = state.placed[0]
        utilisation = state.job.utilisation or 0.0
        self.recorder.change(state.project, held=-held, busy=-held * utilisation)

    def _cycle(self, now: float) -> bool:
        """Run a cycle unless it cannot change anything; True when it changed something."""
        shortcuts = self.settings.shortcuts
        if self.usage.on:
            self.shares = self.usage.shares(now)
            self.gate.set_usage(self.shares)
        if shortcuts and not self.gate.may_change():
            self.skipped += 1
            self.gate.cycle_done(changed=False)
            return False
        self.cycles += 1
        if self.settings.checkpoint_aware:
            self._tell_checkpoints(now)
        if self.tells_running_for:
            self._tell_running_for(now)
        if self.reserving:
            self._tell_waiting_for(now)
        decisions = self._schedule_selected() if shortcuts else self._schedule_all()
        self._apply(decisions, now)
        self.gate.cycle_done(decisions.changed)
        return decisions.changed

    def _tell_checkpoints(self, now: float) -> None:
        """Give each running workload its seconds of work since its last checkpoint (what
        `_evict` would throw away now), as agents report it on a live cluster."""
        interval = self.settings.checkpoint_interval
        for name, workload in self.running.items():
            state = self.by_name[name]
            progress = state.saved + max(now - state.run_start - state.restart, 0.0)
            kept = progress if interval <= 0 else math.floor(progress / interval) * interval
            unsaved = progress - kept
            if workload.since_checkpoint != unsaved:
                state.workload = replace(workload, since_checkpoint=unsaved)
                self.running[name] = state.workload

    def _tell_running_for(self, now: float) -> None:
        """Give each running workload the seconds since it last started, which the engine
        weighs against its queue's min-runtime (the live scheduler reads it from the
        store's placements)."""
        for name, workload in self.running.items():
            state = self.by_name[name]
            ran = max(now - state.run_start, 0.0)
            if workload.running_for != ran:
                state.workload = replace(workload, running_for=ran)
                self.running[name] = state.workload

    def _coming_of_age(self, now: float) -> float:
        """After a cycle that changed nothing: when the first running job that its queue's
        min-runtime protects stops being protected (a reclaim may then go through), on
        the cycle grid; never when nothing waits or nothing is protected."""
        if not self.protects or not self.waiting:
            return math.inf
        first = math.inf
        for name in self.running:
            state = self.by_name[name]
            until = state.run_start + self.protection.get(state.queue, 0.0)
            if now < until < first:
                first = until
        return first if first == math.inf else _grid(first, self.settings.cycle_interval)

    def _tell_waiting_for(self, now: float) -> None:
        """Give each pending workload the time it has waited since it last became pending
        (reservations go to heads that waited long enough)."""
        for name, workload in self.waiting.items():
            waited = now - self.by_name[name].pending_since
            if workload.waiting_for != waited:
                self.waiting[name] = self.by_name[name].workload = replace(
                    workload, waiting_for=waited
                )

    def _schedule_selected(self) -> Decisions:
        """A cycle over the pending work the gate says matters (all of it if in doubt)."""
        selection = self.gate.select(_SHOWN_PER_QUEUE)
        self.hidden += selection.hidden
        decisions = self._schedule(selection.names)
        if selection.checks:
            placed: dict[str, float] = {}
            for name, placements in decisions.bindings.items():
                queue = self.by_name[name].queue
                placed[queue] = placed.get(queue, 0.0) + sum(p.gpu for p in placements)
            if not self.gate.holds(selection, placed, bool(decisions.evictions)):
                self.rechecks += 1
                decisions = self._schedule_all()
        return decisions

    def _schedule_all(self) -> Decisions:
        return self._schedule(tuple(self.waiting))

    def _schedule(self, pending: tuple[str, ...]) -> Decisions:
        waiting = self.waiting
        workloads = (*self.running.values(), *(waiting[name] for name in pending))
        hidden: tuple[tuple[Workload, int], ...] = ()
        if len(pending) < len(waiting):
            shown = Counter(self.by_name[name].kind for name in pending)
            hidden = tuple(
                (kind.workload, kind.count - shown[key])
                for key, kind in self.waiting_kinds.items()
                if kind.count > shown[key]
            )
        snapshot = Snapshot(self.setup.nodes, self.setup.queues, workloads, hidden, self.shares)
        return self.setup.scheduler(snapshot, self.setup.config)

    def _apply(self, decisions: Decisions, now: float) -> None:
        evicted: dict[str, set[int]] = {}
        actions: dict[str, str] = {}
        for eviction in decisions.evictions:
            evicted.setdefault(eviction.workload, set()).update(eviction.tasks)
            actions[eviction.workload] = eviction.action
        for name, tasks in evicted.items():
            state = self.by_name[name]
            running = {placement.task for placement in state.workload.placements}
            if tasks != running:
                raise SimError(name, "the engine evicted part of a gang; jobs run as whole gangs")
            self.evictions[actions[name]] += 1
            self._evict(state, now)
        for name, placements in decisions.bindings.items():
            self._start(self.by_name[name], placements, now)

    def _start(self, state: _JobState, placements: tuple[Placement, ...], now: float) -> None:
        del self.waiting[state.job.name]
        kind = self.waiting_kinds[state.kind]
        kind.count -= 1
        if not kind.count:
            del self.waiting_kinds[state.kind]
        state.workload = _with_placements(state.workload, placements)
        self.running[state.job.name] = state.workload
        gpus = sum(placement.gpu for placement in placements)
        state.placed = (gpus, state.request[1], state.request[2])
        self.usage.change(state.queue, gpus, now)
        if math.isnan(state.first_start):
            state.first_start = now
            state.restart = 0.0
        else:
            state.restart = self.settings.restart_cost
        state.run_start = now
        state.version += 1
        finish = now + state.restart + (state.job.duration - state.saved)
        self.sequence += 1
        heapq.heappush(self.completions, (finish, self.sequence, state.version, state))
        self.gate.started(
            state.queue, state.shape, state.request, state.placed, state.order, state.plain
        )
        utilisation = state.job.utilisation or 0.0
        self.recorder.change(state.project, held=gpus, busy=gpus * utilisation, pending=-state.gpus)

    def _evict(self, state: _JobState, now: float) -> None:
        elapsed = now - state.run_start
        restarting = min(elapsed, state.restart)
        progress = state.saved + max(elapsed - state.restart, 0.0)
        interval = self.settings.checkpoint_interval
        kept = progress if interval <= 0 else math.floor(progress / interval) * interval
        state.lost += (progress - kept) * state.gpus
        state.restarts += restarting * state.gpus
        state.saved = kept
        state.preemptions += 1
        state.version += 1
        self._stop(state, now)
        state.workload = _with_placements(state.workload, ())
        self._to_pending(state)

    # -- the result --------------------------------------------------------------------

    def _result(self, end: float, wall: float) -> SimResult:
        recorder = self.recorder
        submitted = np.array([state.job.submitted for state in self.jobs])
        first = np.array([state.first_start for state in self.jobs])
        finished = np.array([state.end for state in self.jobs])
        project = np.array([state.project for state in self.jobs], dtype=np.int64)
        arrived = submitted <= end
        started = ~np.isnan(first)
        done = ~np.isnan(finished)
        delay = np.where(started, first - submitted, end - submitted)
        completion = finished - submitted
        preemptions = np.array([state.preemptions for state in self.jobs])
        lost = np.array([state.lost for state in self.jobs])
        restarts = np.array([state.restarts for state in self.jobs])
        window = recorder.in_window
        # A run stopped before the window's end is measured over the part it covered.
        span = min(self.window, end) or 1.0
        by_project = {}
        for at, name in enumerate(self.projects):
            mine = project == at
            entitled = window[ENTITLED, at]
            by_project[name] = ProjectResult(
                quota=float(recorder.quotas[at]),
                jobs=int(mine.sum()),
                completed=int((mine & done).sum()),
                unstarted=int((mine & arrived & ~started).sum()),
                gpu_hours=float(recorder.in_run[HELD, at] / HOUR),
                mean_gpus=float(window[HELD, at] / span),
                mean_pending_gpus=float(window[PENDING, at] / span),
                entitlement_received=float(window[RECEIVED, at] / entitled)
                if entitled > 0
                else None,
                queueing_delay=stats(delay[mine & arrived]),
                completion_time=stats(completion[mine & done]),
                preemptions=int(preemptions[mine].sum()),
                lost_gpu_hours=float(lost[mine].sum() / HOUR),
            )
        received = [
            result.entitlement_received
            for result in by_project.values()
            if result.entitlement_received is not None
        ]
        every_job_reports = all(state.job.utilisation is not None for state in self.jobs)
        area = self.capacity * span
        times, means = recorder.series(end)
        return SimResult(
            policy=self.setup.policy,
            gpus=self.capacity,
            window=self.window,
            end=end,
            projects=self.projects,
            jobs=len(self.jobs),
            completed=int(done.sum()),
            unstarted=int((arrived & ~started).sum()),
            allocation=float(window[HELD].sum() / area) if area else 0.0,
            utilisation=float(window[BUSY].sum() / area)
            if every_job_reports and self.jobs and area
            else None,
            queueing_delay=stats(delay[arrived]),
            completion_time=stats(completion[done]),
            gpu_hours=float(recorder.in_run[HELD].sum() / HOUR),
            mean_pending_gpus=float(window[PENDING].sum() / span),
            peak_pending_gpus=recorder.peak_pending,
            fairness=jain(received),
            preemptions=int(preemptions.sum()),
            evictions_by_action=dict(sorted(self.evictions.items())),
            lost_gpu_hours=float(lost.sum() / HOUR),
            restart_gpu_hours=float(restarts.sum() / HOUR),
            cycles=self.cycles,
            skipped_cycles=self.skipped,
            wall_seconds=wall,
            by_project=by_project,
            series=Series(times, means[:, HELD], means[:, BUSY], means[:, PENDING]),
        )


def _protection(queues: tuple[Queue, ...]) -> dict[str, float]:
    """Per queue, the longer of its min-runtimes (own, else its nearest ancestor's)."""
    by_name = {queue.name: queue for queue in queues}

    def inherited(queue: Queue, field: str) -> float:
        at: Queue | None = queue
        while at is not None:
            value: float | None = getattr(at, field)
            if value is not None:
                return value
            at = by_name.get(at.parent) if at.parent else None
        return 0.0

    return {
        queue.name: max(
            inherited(queue, "preempt_min_runtime"), inherited(queue, "reclaim_min_runtime")
        )
        for queue in queues
    }


def _grid(now: float, interval: float) -> float:
    """The first cycle time at or after `now`."""
    return math.ceil(now / interval - 1e-9) * interval


def _with_placements(workload: Workload, placements: tuple[Placement, ...]) -> Workload:
    return replace(workload, placements=placements)
