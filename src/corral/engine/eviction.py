"""The victim search shared by reclaim and preempt: tentative eviction, keeping the
victims that were not needed, and the units victims come in.

An attempt evicts victims one by one in the tentative state until the candidate fits,
then puts back those whose room it did not need and commits; or, when the victims run
out first, rolls everything back. Work started earlier in the same cycle may be taken
off again as a victim too: that is no eviction, since it never ran.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.engine.kinds import GPU, EvictionKind
from corral.engine.quota import diverging, quota_block, within_quota
from corral.engine.session import Session
from corral.engine.state import Candidate, QueueState, WorkloadState
from corral.model import Placement, Workload
from corral.model.resources import EPSILON

# A victim: some running tasks of one workload, evicted together. `tasks` None means
# every task still running (a whole workload, or the minimum gang of an elastic one).
Unit = tuple[WorkloadState, tuple[int, ...] | None]
# Gives the next victim to try for one attempt, or None when there is none.
NextVictim = Callable[[], Unit | None]
# Places a candidate tentatively by moving running work: returns what records the
# placement and the moves, or None (the state as it was) when moves do not make room.
MakeRoom = Callable[[Candidate], Callable[[], None] | None]


class VictimSearch:
    """Victim units of every queue, consumed over one cycle's reclaim and preempt."""

    def __init__(self, session: Session) -> None:
        self.session = session
        # Running preemptible workloads by queue, and each queue's victim units in order,
        # worked out when first asked for.
        self._victims: dict[str, list[WorkloadState]] | None = None
        self._units: dict[str, list[Unit]] = {}
        # Victim lists are consumed front first: where each queue's untouched units start.
        self._cursor: dict[str, int] = {}
        self._tentative: set[int] = set()
        # Within one eviction attempt, where each queue's search for victims resumes:
        # units passed over stay unusable until the attempt ends.
        self._resume: dict[str, int] = {}
        # Within one eviction attempt, the units whose queue gave before another because
        # of queue priority: the two queues whose priorities decided (see `Reclaim`).
        self._lower_priority: dict[int, tuple[QueueState, QueueState]] = {}

    def evict_for(
        self,
        candidate: Candidate,
        next_victim: NextVictim,
        kind: EvictionKind,
        moves: MakeRoom | None = None,
    ) -> tuple[bool, int]:
        """Evict victims one by one until the candidate fits; commit or roll back. With
        `moves`, once the GPUs free would do but the candidate does not fit as things
        are, running work may be moved to make room before more is evicted.

        Returns whether the candidate was placed and how many victims were tried."""
        session = self.session
        state = session.state
        ws = candidate.workload
        mark = state.checkpoint()
        victims: list[tuple[Unit, list[Placement]]] = []
        self._tentative.clear()
        self._resume.clear()
        self._lower_priority.clear()
        while True:
            commit: Callable[[], None] | None = None
            if (
                candidate.request[GPU] <= state.free_gpu + EPSILON
                and quota_block(ws, candidate.request) is None
                and (
                    not isinstance(session.place_checked(ws, candidate.tasks), str)
                    or (moves is not None and (commit := moves(candidate)) is not None)
                )
            ):
                if commit is not None:
                    commit()
                self._keep_needed(victims)
                for given, taken in victims:
                    if taken:
                        victim = given[0]
                        tasks = tuple(sorted(placement.task for placement in taken))
                        freed = sum(placement.gpu for placement in taken)
                        decided = self._lower_priority.get(id(given))
                        reason = _eviction_reason(kind, victim, ws, freed, decided)
                        session.record_eviction(victim, tasks, kind, ws, reason)
                state.journal.clear()
                return True, len(victims)
            unit = next_victim()
            if unit is None:
                state.rollback(mark)
                return False, len(victims)
            victim, unit_tasks = unit
            chosen = sorted(victim.running) if unit_tasks is None else list(unit_tasks)
            victims.append((unit, [state.unbind(victim, task) for task in chosen]))
            self._tentative.add(id(unit))

    def first_unit(
        self,
        leaf: QueueState,
        ws: WorkloadState,
        below_priority: int | None,
        on_node: int | None = None,
    ) -> Unit | None:
        """The first victim unit of `leaf` still in place that could make room for `ws`
        (only units below `below_priority`, and with a task on node `on_node`, when
        given). A workload that has run for less than its queue's min-runtime of the
        kind (preempt when `below_priority` is given, else reclaim) is no victim, though
        an elastic one may still lose its extra tasks.

        Work of `leaf` started earlier in this cycle comes first at its priority: taking
        it off loses nothing, where evicting running work to make room while the queue's
        new work takes other room would only swap the one for the other."""
        found = self._first_running(leaf, ws, below_priority, on_node)
        start = self._first_start(leaf, ws, below_priority, on_node)
        if start is not None and (
            found is None or start.workload.priority <= found[1][0].workload.priority
        ):
            return (start, None)
        if found is None:
            return None
        position, unit = found
        self._resume[leaf.name] = position + 1
        return unit

    def _first_start(
        self,
        leaf: QueueState,
        ws: WorkloadState,
        below_priority: int | None,
        on_node: int | None,
    ) -> WorkloadState | None:
        """The first work of `leaf` started in this cycle, in `start_order`, that could
        make room for `ws` and may be taken off again (`Session.withdrawable`)."""
        session = self.session
        starts = session.new_starts_of(leaf.name)
        if not starts:
            return None
        # Work that may never be taken off again leaves the front of the line for good.
        dead = 0
        while dead < len(starts) and session.never_withdrawn(starts[dead]):
            dead += 1
        del starts[:dead]
        for other in starts:
            if below_priority is not None and other.workload.priority >= below_priority:
                return None
            if session.withdrawable(other) and self._usable(other, ws, on_node):
                return other
        return None

    def _usable(self, victim: WorkloadState, ws: WorkloadState, on_node: int | None) -> bool:
        """Whether a task of `victim` runs where `ws` may go (on node `on_node`, when
        given)."""
        allowed = self.session.placer.allowed_for(ws)
        by_name = self.session.state.by_name
        nodes = [by_name[placement.node].index for placement in victim.running.values()]
        return (allowed is None or any(index in allowed for index in nodes)) and (
            on_node is None or on_node in nodes
        )

    def _first_running(
        self,
        leaf: QueueState,
        ws: WorkloadState,
        below_priority: int | None,
        on_node: int | None,
    ) -> tuple[int, Unit] | None:
        """The first unit of work that ran as the cycle began for `first_unit`, with its
        position in the queue's units (the search resumes after it once it is taken)."""
        kind = "reclaim" if below_priority is None else "preempt"
        min_runtime = leaf.min_runtime[kind]
        units = self._victim_units(leaf)
        touched = self.session.touched
        start = self._cursor.get(leaf.name, 0)
        while start < len(units) and units[start][0].name in touched:
            start += 1
        self._cursor[leaf.name] = start
        # Nothing passed over earlier in this attempt becomes usable again during it.
        start = max(start, self._resume.get(leaf.name, 0))
        allowed = self.session.placer.allowed_for(ws)
        by_name = self.session.state.by_name
        for position in range(start, len(units)):
            unit = units[position]
            victim, tasks = unit
            if below_priority is not None and victim.workload.priority >= below_priority:
                # Units are sorted by priority: nothing further down qualifies either.
                self._resume[leaf.name] = position
                return None
            if victim.name in touched or victim.started or id(unit) in self._tentative:
                continue
            if tasks is None and min_runtime > 0 and _too_young(victim, min_runtime):
                continue
            wanted = tasks if tasks is not None else tuple(victim.original)
            running = [
                task
                for task in wanted
                if task in victim.running and victim.running[task] is victim.original.get(task)
            ]
            if not running or (tasks is not None and len(running) != len(tasks)):
                continue
            if allowed is not None and not any(
                by_name[victim.running[task].node].index in allowed for task in running
            ):
                continue
            if on_node is not None and not any(
                by_name[victim.running[task].node].index == on_node for task in running
            ):
                continue
            return position, unit
        self._resume[leaf.name] = len(units)
        return None

    def holds_victims(self, leaf: QueueState) -> bool:
        """Whether preemptible work of `leaf` ran when the cycle began."""
        return bool(self._victim_units(leaf))

    def note_lower_priority(self, unit: Unit, lower: QueueState, higher: QueueState) -> None:
        """Record that `unit`'s queue gives before another because queue `lower` has a
        lower priority than `higher`: the eviction's reason says so."""
        self._lower_priority[id(unit)] = (lower, higher)

    def forget_passed_over(self) -> None:
        """Let the rest of this attempt look again at units it passed over (they may be
        usable on the next node a search by node tries)."""
        self._resume.clear()

    def _victim_units(self, leaf: QueueState) -> list[Unit]:
        """Victim units of a queue in the order they are taken: lowest priority first; an
        elastic workload's extra tasks before minimum gangs; the fewest GPU-seconds of work
        lost since the last checkpoint; idle before busy; newest first."""
        if self._victims is None:
            self._victims = {}
            for ws in self.session.workloads:
                if ws.original and ws.workload.preemptible:
                    self._victims.setdefault(ws.queue.name, []).append(ws)
        units = self._units.get(leaf.name)
        if units is None:
            units = self._units[leaf.name] = _units_in_order(self._victims.get(leaf.name, []))
        return units

    def _keep_needed(self, victims: list[tuple[Unit, list[Placement]]]) -> None:
        """Put back victims whose devices the preemptor did not need after all."""
        state = self.session.state
        # Workloads whose minimum gang stays evicted: their extra tasks go with it.
        gone_whole: set[str] = set()
        for index in range(len(victims) - 1, -1, -1):
            unit, taken = victims[index]
            victim, tasks = unit
            if tasks is not None and victim.name in gone_whole:
                continue
            mark = state.checkpoint()
            for placement in taken:
                # One at a time: a victim's tasks may share a device or a node's CPUs.
                if not self._room_for(victim, placement):
                    break
                state.bind(victim, placement)
            else:
                if within_quota(victim):
                    victims[index] = (unit, [])
                    continue
            state.rollback(mark)
            if tasks is None:
                gone_whole.add(victim.name)

    def _room_for(self, ws: WorkloadState, placement: Placement) -> bool:
        node = self.session.state.by_name[placement.node]
        group = ws.tasks[placement.task]
        if node.free_cpu + EPSILON < group.cpu or node.free_memory + EPSILON < group.memory:
            return False
        share = placement.gpu / len(placement.devices) if placement.devices else 0.0
        return all(node.used[device] + share <= 1.0 + EPSILON for device in placement.devices)


def _units_in_order(victims: list[WorkloadState]) -> list[Unit]:
    """The victim units of a queue's running preemptible workloads, in the order of
    `VictimSearch._victim_units`."""
    entries: list[tuple[tuple[object, ...], Unit]] = []
    for ws in victims:
        workload = ws.workload
        unsaved = _unsaved_seconds(workload)
        rank = (0 if workload.idle else 1, -workload.submitted, workload.name)
        if workload.min_available is not None:
            # Only an elastic workload's tasks beyond its minimum go one by one.
            min_tasks = workload.min_tasks
            for task, placement in ws.original.items():
                if task >= min_tasks:
                    lost = placement.gpu * unsaved
                    entries.append(((workload.priority, 0, lost, *rank, -task), (ws, (task,))))
        lost = (
            unsaved * sum(placement.gpu for placement in ws.original.values()) if unsaved else 0.0
        )
        entries.append(((workload.priority, 1, lost, *rank, 0), (ws, None)))
    entries.sort(key=lambda item: item[0])
    return [unit for _, unit in entries]


def _unsaved_seconds(workload: Workload) -> float:
    """Seconds of work a workload would lose if evicted now: since its last checkpoint,
    else since it started; 0 when neither is known (then age alone decides)."""
    if workload.since_checkpoint is not None:
        return workload.since_checkpoint
    return workload.running_for or 0.0


def _too_young(victim: WorkloadState, min_runtime: float) -> bool:
    running_for = victim.workload.running_for
    return running_for is not None and running_for < min_runtime - EPSILON


def _eviction_reason(
    kind: EvictionKind,
    victim: WorkloadState,
    by: WorkloadState,
    freed: float,
    decided: tuple[QueueState, QueueState] | None = None,
) -> str:
    """Why `victim` is evicted for `by`, in the words of the victim's pending reason
    (`freed`: the GPUs the eviction took from the victim's queue; `decided`: the queue of
    lower priority and the one of higher, when queue priority chose the victim's queue
    over one further over its fair share)."""
    if kind == "preempt":
        return (
            f"{by.name} (priority {by.workload.priority}) preempts lower-priority work "
            f"(priority {victim.workload.priority}) in queue {victim.queue.name}"
        )
    over, under = diverging(victim.queue, by.queue)
    why = (
        "under its deserved quota"
        if under.alloc[GPU] <= under.deserved[GPU] + EPSILON
        else "under its fair share"
    )
    priority = ""
    if decided is not None:
        lower, higher = decided
        priority = (
            f"; queue {lower.name} has a lower priority than {higher.name} "
            f"({lower.priority} < {higher.priority})"
        )
    if over.alloc[GPU] + freed <= over.fair_share[GPU] + EPSILON:
        # Taken for a deserved quota from a queue at its fair share but above its own.
        return f"queue {over.name} is above its deserved quota; {under.name} is {why}{priority}"
    return f"queue {over.name} is over its fair share; {under.name} is {why}{priority}"
