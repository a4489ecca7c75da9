"""One scheduling cycle: allocate, consolidate, reclaim, preempt.

`schedule(snapshot, config)` is pure and deterministic: the same input always gives the
same decisions. A cycle loads a Session (the tentative ClusterState, the placer, the
workloads and the queues' fair shares) and runs the configured actions on it in order,
each from its own module under `engine.actions`; an attempt that evicts or moves work is
simulated first and committed only when the workload it is for really fits, otherwise
it is rolled back.
"""

from __future__ import annotations

import gc
import operator
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from itertools import filterfalse

from corral.engine.actions import Allocate, Consolidate, Preempt, Reclaim
from corral.engine.demand import Demand, add_up
from corral.engine.errors import ConfigError, SnapshotError
from corral.engine.eviction import VictimSearch
from corral.engine.fairshare import decayed_weights, divide_tree
from corral.engine.fragmentation import Fragmentation, Shape, shapes_of
from corral.engine.kinds import ACTION_NAMES, ActionName
from corral.engine.loading import Loading, load_changes, load_workloads
from corral.engine.placement import Placer
from corral.engine.pools import schedule_pools, uses_pools
from corral.engine.session import Session
from corral.engine.state import ClusterState, QueueState, WorkloadState, as_resources
from corral.model import (
    Decisions,
    Placement,
    QueueCycle,
    QueueStatus,
    Reservation,
    SchedulerConfig,
    Snapshot,
    UnknownParent,
    Workload,
    check_tree,
)
from corral.model.usage import decay_settings

# The most kinds of workload a Scheduler remembers (see WorkloadState.alike_kind).
_MAX_KINDS = 10_000
_RUNNING = operator.attrgetter("running")


def schedule(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Decisions:
    """Run one scheduling cycle over `snapshot` and return what it decided."""
    with collector_paused():
        if uses_pools(snapshot):
            return schedule_pools(snapshot, config or SchedulerConfig(), _one_pool, apply_decisions)
        return _one_pool(snapshot, config or SchedulerConfig())


# Cycles under way (in any thread), and whether the collector ran before the first.
_paused = 0
_was_enabled = False
_paused_lock = threading.Lock()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a cycle runs. A cycle makes hundreds of
    thousands of short-lived objects (states, placements, keys) and drops them by
    reference counting; the collector's passes over them, and over the state a
    Scheduler keeps, were a large share of a large cycle (benchmarks/engine_scale.py).
    Whatever reference cycles appear meanwhile are collected by its next pass once no
    cycle runs. Nested and concurrent cycles share one pause; a collector that was off
    stays off."""
    global _paused, _was_enabled
    with _paused_lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()


def _one_pool(snapshot: Snapshot, config: SchedulerConfig) -> Decisions:
    cycle = Cycle(snapshot, config)
    decisions = cycle.run()
    cycle.session.release()
    return decisions


def apply_decisions(snapshot: Snapshot, decisions: Decisions) -> Snapshot:
    """The snapshot after `decisions`: evictions first, then bindings."""
    touched = {*decisions.bindings, *(eviction.workload for eviction in decisions.evictions)}
    workloads = list(snapshot.workloads)
    # A cycle touches few of the workloads it was given (a server under a stream of
    # submissions keeps thousands): they are found first, and only they are looked at.
    places = [i for i, workload in enumerate(workloads) if workload.name in touched]
    after = decided({workloads[i].name: workloads[i] for i in places}, decisions)
    for index in places:
        workloads[index] = after[workloads[index].name]
    return replace(snapshot, workloads=tuple(workloads))


def decided(workloads: Mapping[str, Workload], decisions: Decisions) -> dict[str, Workload]:
    """Those of `workloads` (by name) that `decisions` change, as they are after them:
    less their evicted tasks, with the tasks bound. Looks at those alone, for a caller
    that keeps its workloads by name (the server's scheduler loop)."""
    evicted: dict[str, set[int]] = {}
    for eviction in decisions.evictions:
        evicted.setdefault(eviction.workload, set()).update(eviction.tasks)
    bindings = decisions.bindings
    after: dict[str, Workload] = {}
    for name in evicted.keys() | bindings.keys():
        workload = workloads.get(name)
        if workload is None:
            continue
        gone = evicted.get(name, set())
        started = bindings.get(name, ())
        placements = [p for p in workload.placements if p.task not in gone]
        running_for, since_checkpoint = workload.running_for, workload.since_checkpoint
        if started and len(placements) == 0:
            # Started (again) now: young for min-runtime, with no work to lose yet.
            running_for = 0.0
            since_checkpoint = None if since_checkpoint is None else 0.0
        placements.extend(started)
        placements.sort(key=lambda p: p.task)
        after[name] = replace(
            workload,
            placements=tuple(placements),
            running_for=running_for,
            since_checkpoint=since_checkpoint,
        )
    return after


class Scheduler:
    """`schedule()` for a sequence of snapshots of one cluster, such as a simulation's.

    It keeps the cycle's state of running work between calls. A workload that runs as
    it did when the last cycle ended (as that cycle left it, or as given then) is not
    loaded again, and one that stopped or changed is taken off and loaded as it is now.
    Decisions are the same as `schedule()` gives on each snapshot: the kept state holds
    no more than the snapshot says, and rounded totals do not depend on the order work
    was added in. Snapshots with other nodes or queues are scheduled afresh.
    """

    def __init__(self) -> None:
        self._kept: Kept | None = None
        # One cycle at a time works on the kept state.
        self._lock = threading.Lock()

    def __call__(self, snapshot: Snapshot, config: SchedulerConfig | None = None) -> Decisions:
        with self._lock, collector_paused():
            # A cycle that fails leaves nothing kept: the next one starts afresh.
            kept, self._kept = self._kept, None
            if kept is not None and not kept.holds(snapshot):
                kept.release()
                kept = None
            if uses_pools(snapshot):
                # Each pool is its own cycle, made afresh (see engine.pools).
                if kept is not None:
                    kept.release()
                return schedule(snapshot, config)
            cycle = Cycle(snapshot, config or SchedulerConfig(), kept)
            decisions = cycle.run()
            self._kept = Kept(snapshot, cycle, decisions)
            return decisions


class Kept:
    """The state a cycle ended with, for the next cycle of a Scheduler."""

    def __init__(self, snapshot: Snapshot, cycle: Cycle, decisions: Decisions) -> None:
        self.nodes = snapshot.nodes
        self.queue_specs = snapshot.queues
        self.queues: dict[str, QueueState] = cycle.session.queues
        self.state: ClusterState = cycle.session.state
        self.workloads: dict[str, WorkloadState] = cycle.loaded
        # The snapshot's workloads, those that run two tasks or more, and those the
        # cycle decided about: what the next cycle loads by (`load_changes`).
        self.given = snapshot.workloads
        self.multi = cycle.multi
        self.decided = {*decisions.bindings, *(e.workload for e in decisions.evictions)}
        self.shapes: Counter[Shape] = cycle.shapes
        self.kinds: dict[object, object] = cycle.kinds
        self.demand: Demand | None = cycle.demand
        # The GPU weights the queues' fair shares were divided with.
        self.weights = cycle.weights

    def release(self) -> None:
        """Let reference counting free the kept workloads' states (see
        `WorkloadState.release`)."""
        for ws in self.workloads.values():
            ws.release()

    def holds(self, snapshot: Snapshot) -> bool:
        """Whether the kept state is of the same nodes and queues."""
        return (self.nodes is snapshot.nodes or self.nodes == snapshot.nodes) and (
            self.queue_specs is snapshot.queues or self.queue_specs == snapshot.queues
        )


class Cycle:
    """One cycle: a Session loaded from the snapshot, and the actions run on it in order."""

    def __init__(
        self, snapshot: Snapshot, config: SchedulerConfig, kept: Kept | None = None
    ) -> None:
        self.config = config
        self.kinds: dict[object, object] = {}
        fresh = kept is None or not kept.holds(snapshot)
        if kept is not None and not fresh:
            queues, state, previous = _reuse(kept)
            # The tasks of the kept workloads by shape, and what they request, kept up to
            # date as they change.
            self.shapes = kept.shapes
            self.demand: Demand | None = kept.demand or Demand(previous.values())
            # What makes workloads alike, one object for each (a table that only grows
            # while the nodes and queues stay: begun again when large).
            if len(kept.kinds) < _MAX_KINDS:
                self.kinds = kept.kinds
        else:
            queues = _build_queues(snapshot)
            state = ClusterState(snapshot.nodes, queues)
            previous = {}
            self.shapes = Counter()
            self.demand = None
        max_memory = state.max_memory
        # Workloads whose demand is to be worked out (and counted) this cycle.
        changed: list[WorkloadState] = []
        loading = Loading(fresh, max_memory, self.shapes, self.kinds, self.demand, changed)
        self.loaded: dict[str, WorkloadState]
        self.multi: set[str]
        if kept is not None and not fresh:
            self.multi = kept.multi
            self.loaded = load_changes(
                snapshot, queues, state, previous, loading, kept.given, kept.decided, self.multi
            )
        else:
            self.multi = set()
            self.loaded = load_workloads(snapshot, queues, state, previous, loading, self.multi)
        workloads = list(self.loaded.values())
        waiting = list(filterfalse(_RUNNING, workloads))
        if not fresh:
            # Kept work that waits is tried again from the start.
            for ws in waiting:
                ws.reason = None
        fragmentation = _index(snapshot, state, self.shapes, fresh, max_memory)
        placer = Placer(state, config, fragmentation)
        self.session: Session = Session(config, queues, state, workloads, waiting, placer)
        self.weights: dict[str, float] = _time_decayed_weights(snapshot, queues)
        self.usage = snapshot.usage
        _divide_fair_shares(
            self.session,
            self.weights,
            self.demand,
            changed,
            None if fresh or kept is None else kept.weights,
        )

    def run(self) -> Decisions:
        """Run the configured actions in order and return the decisions."""
        session = self.session
        victims = VictimSearch(session)
        consolidate = Consolidate(session)
        # Reclaim may move work as well when the cycle consolidates.
        moves = consolidate.moves_for if "consolidate" in self.config.actions else None
        actions: dict[ActionName, Callable[[], None]] = {
            "allocate": Allocate(session).run,
            "consolidate": consolidate.run,
            "reclaim": Reclaim(session, victims, moves).run,
            "preempt": Preempt(session, victims).run,
        }
        if session.reservations is not None:
            session.reservations.reserve(session.waiting)
        for name in self.config.actions:
            actions[_known_action(name)]()
        return _decisions(session, self.weights, self.usage)


def _known_action(name: str) -> ActionName:
    for known in ACTION_NAMES:
        if name == known:
            return known
    raise ConfigError(f"unknown action {name!r}; expected one of {', '.join(ACTION_NAMES)}")


# -- loading a session ---------------------------------------------------------------


def _reuse(
    kept: Kept,
) -> tuple[dict[str, QueueState], ClusterState, dict[str, WorkloadState]]:
    """The queues, state and workloads kept from the last cycle. The queues keep what
    their work requests: the cycle's `Demand` sets again those whose sums change."""
    return kept.queues, kept.state, kept.workloads


def _index(
    snapshot: Snapshot,
    state: ClusterState,
    workload_shapes: Counter[Shape],
    fresh: bool,
    max_memory: int,
) -> Fragmentation:
    """Tell the state which nodes are alike for this cycle's task shapes (those of its
    workloads and of the hidden ones), and bring its free-capacity indices up to date;
    returns the fragmentation model."""
    shapes = shapes_of(snapshot.hidden, max_memory)
    shapes.update(workload_shapes)
    fragmentation = Fragmentation(state.classes, shapes)
    state.journal.clear()
    if state.set_kinds(fragmentation.kind_of_class) or fresh:
        state.index()
    else:
        state.settle()
    return fragmentation


def _time_decayed_weights(snapshot: Snapshot, queues: dict[str, QueueState]) -> dict[str, float]:
    """The GPU over-quota weights of the queues with time-decayed fair share on (none:
    the policy is off everywhere, and the cycle divides as it always did)."""
    if all(queue.fair_share_half_life is None for queue in snapshot.queues):
        return {}
    factors = {name: setting.k for name, setting in decay_settings(snapshot.queues).items()}
    roots = [queue for queue in queues.values() if queue.parent is None]
    return decayed_weights(roots, snapshot.usage, factors)


def _divide_fair_shares(
    session: Session,
    gpu_weights: dict[str, float],
    demand: Demand | None,
    changed: list[WorkloadState],
    kept_weights: dict[str, float] | None = None,
) -> None:
    """Add up what each queue's work requests and divide the cluster into fair shares
    (the GPU surplus by `gpu_weights` where given). With the exact sums of a kept state
    (`demand`), only the `changed` workloads' demands are worked out and counted; and
    when no queue's total changed and the kept queues' shares were divided with the
    same weights (`kept_weights`), as in a fifth of a busy replay's cycles, they stand
    as they are (a kept state's nodes, so its capacity, are the same)."""
    for ws in session.workloads if demand is None else changed:
        if ws.demand is None:
            ws.demand = session.request_of(ws, range(len(ws.tasks)))
        if demand is not None:
            demand.count(ws)
    if demand is None:
        add_up(session.workloads, session.queues.values())
    elif not demand.set_requested(session.queues.values()) and kept_weights == gpu_weights:
        return
    roots = [queue for queue in session.queues.values() if queue.parent is None]
    for name, share in divide_tree(roots, session.state.capacity, gpu_weights).items():
        queue = session.queues[name]
        # A kept queue whose share is unchanged has its allotment already.
        if queue.fair_share != share:
            queue.set_fair_share(share)


# -- results -------------------------------------------------------------------------


def _decisions(
    session: Session, weights: dict[str, float], usage: Mapping[str, float]
) -> Decisions:
    """What the cycle decided: tasks started, evictions, pending reasons, queue totals
    (with the time-decayed weights, where that policy is on)."""
    bindings: dict[str, tuple[Placement, ...]] = {}
    pending: dict[str, str] = {}
    evicted = session.evicted
    for ws in session.in_play():
        started = ws.started
        if started:
            if len(started) == 1:
                bindings[ws.name] = tuple(started.values())
            else:
                bindings[ws.name] = tuple(started[task] for task in sorted(started))
        elif not ws.running:
            name = ws.workload.name
            pending[name] = evicted.get(name) or ws.reason or "not considered this cycle"
    queues = {name: _status(queue, weights, usage) for name, queue in session.queues.items()}
    reservations: dict[str, Reservation] = {}
    if session.reservations is not None:
        reservations = session.reservations.decided()
        session.reservations.annotate(pending, reservations, session.evicted)
    return Decisions(bindings, tuple(session.evictions), pending, queues, reservations=reservations)


def _status(
    queue: QueueState, weights: dict[str, float], usage: Mapping[str, float]
) -> QueueStatus:
    """A queue's totals as the cycle ends: the object it reported last when they are the
    same (most queues of a busy cluster change little from one cycle to the next), else a
    new one that keeps the last one's parts that stayed the same."""
    weight = weights.get(queue.name)
    used = usage.get(queue.name, 0.0) if queue.name in weights else None
    fair_share, alloc, requested = queue.fair_share, queue.alloc, queue.requested
    last = queue.status
    if last is None:
        parts = (as_resources(fair_share), as_resources(alloc), as_resources(requested))
    else:
        totals, reported = last
        same_share = totals[0] == fair_share
        same_alloc = totals[1] == alloc
        same_requested = totals[2] == requested
        unchanged = same_share and same_alloc and same_requested
        if unchanged and totals[3] == weight and totals[4] == used:
            return reported
        parts = (
            reported.fair_share if same_share else as_resources(fair_share),
            reported.allocated if same_alloc else as_resources(alloc),
            reported.requested if same_requested else as_resources(requested),
        )
    status = QueueStatus(
        deserved=queue.queue.deserved,
        limit=queue.queue.limit,
        fair_share=parts[0],
        allocated=parts[1],
        requested=parts[2],
        weight=weight,
        usage=used,
    )
    queue.status = ((fair_share[:], alloc[:], requested[:], weight, used), status)
    return status


def _build_queues(snapshot: Snapshot) -> dict[str, QueueState]:
    try:
        check_tree(snapshot.queues)
    except UnknownParent as error:
        raise SnapshotError(f"queue {error.queue}: unknown parent {error.parent!r}") from None
    except QueueCycle as error:
        raise SnapshotError(f"queue {error.queue}: the queue tree has a cycle") from None
    queues = {queue.name: QueueState(queue, age) for age, queue in enumerate(snapshot.queues)}
    for queue in queues.values():
        parent_name = queue.queue.parent
        if parent_name is None:
            continue
        parent = queues[parent_name]
        queue.parent = parent
        parent.children.append(queue)
    for queue in queues.values():
        level: QueueState | None = queue
        while level is not None:
            queue.path.append(level)
            level = level.parent
        queue.min_runtime = {
            "preempt": _inherited(queue, "preempt_min_runtime"),
            "reclaim": _inherited(queue, "reclaim_min_runtime"),
        }
        queue.reserve_after = _inherited(queue, "reserve_after")
    return queues


def _inherited(queue: QueueState, field: str) -> float:
    """The queue's own setting of `field`, else its nearest ancestor's; 0 when none is set."""
    for level in queue.path:
        value: float | None = getattr(level.queue, field)
        if value is not None:
            return value
    return 0.0
