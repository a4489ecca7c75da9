"""What the actions of one cycle share: the tentative state, the placer, the workloads,
and what has been decided so far.

`engine.cycle` loads a Session from a snapshot and hands it to each action in turn. The
helpers here are the ones more than one action needs: a workload's request, placing
tasks with their quotas checked, the pending work in fairness order, and recording an
eviction.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Sequence

from corral.engine.kinds import EVICTED, EvictionKind, Request
from corral.engine.ordering import InOrder
from corral.engine.placement import Failure, Placer
from corral.engine.quota import quota_block
from corral.engine.reservation import Reservations
from corral.engine.state import Candidate, ClusterState, QueueState, WorkloadState
from corral.model import Eviction, Placement, SchedulerConfig


class Session:
    """The state of one cycle, as its actions work on it."""

    def __init__(
        self,
        config: SchedulerConfig,
        queues: dict[str, QueueState],
        state: ClusterState,
        workloads: list[WorkloadState],
        waiting: list[WorkloadState],
        placer: Placer,
    ) -> None:
        self.config = config
        self.queues = queues
        self.state = state
        self.workloads = workloads
        # Workloads with no task running as the cycle began.
        self.waiting = waiting
        self.placer = placer
        self.evictions: list[Eviction] = []
        # Why each workload evicted this cycle is pending: the last eviction's reason.
        self.evicted: dict[str, str] = {}
        # Workloads evicted or moved this cycle are not victims again in the same cycle.
        self.touched: set[str] = set()
        # Preemptible workloads that waited as the cycle began and were started in it, by
        # queue (see `new_starts_of`), with how many were added to each since it was last
        # put in order; and the workloads something was evicted or moved for.
        self._new_starts: dict[str, list[WorkloadState]] = {}
        self._unordered: dict[str, int] = {}
        self.served: set[str] = set()
        # True from the end of allocate until work is evicted or moved: meanwhile the
        # state has only filled up, so pending work that did not fit still does not.
        self.settled = False
        # Counts the workloads started and evicted or moved so far: the pending work
        # changes only with it (see `pending`).
        self.changes = 0
        self._pending: tuple[tuple[int, int], Sequence[Candidate]] | None = None
        self._by_node: dict[str, list[WorkloadState]] | None = None
        # Backfill reservations, when some queue sets `reserve_after`.
        self.reservations: Reservations | None = None
        if any(queue.reserve_after > 0 for queue in queues.values()):
            self.reservations = Reservations(state, placer, workloads)
            placer.hold = self.reservations.hold_for

    def request_of(self, ws: WorkloadState, tasks: Iterable[int]) -> Request:
        """GPU, CPU and memory of some tasks: as placed for running ones, nominal otherwise."""
        gpu = cpu = memory = 0.0
        for task in tasks:
            group = ws.tasks[task]
            placement = ws.running.get(task)
            gpu += placement.gpu if placement is not None else self.placer.nominal_gpu(group)
            cpu += group.cpu
            memory += group.memory
        return (gpu, cpu, memory)

    def in_play(self) -> list[WorkloadState]:
        """The workloads that may start, grow or be pending by now: those that waited as
        the cycle began, unless something was evicted or moved or an elastic workload runs
        (then every workload). Most of a busy cluster's work runs on untouched."""
        if self.touched or self.state.elastic_running:
            return self.workloads
        return self.waiting

    def release(self) -> None:
        """Let reference counting free the workloads' states once the cycle is done."""
        for ws in self.workloads:
            ws.release()

    @property
    def by_node(self) -> dict[str, list[WorkloadState]]:
        """The workloads running on each node as the cycle began."""
        if self._by_node is None:
            by_node: dict[str, list[WorkloadState]] = {}
            for ws in self.workloads:
                original = ws.original
                if not original:
                    continue
                if len(original) == 1:
                    # Most work runs one task: its one node, without a set of them.
                    for placement in original.values():
                        on_node = by_node.get(placement.node)
                        if on_node is None:
                            by_node[placement.node] = [ws]
                        else:
                            on_node.append(ws)
                    continue
                for node in dict.fromkeys(placement.node for placement in original.values()):
                    by_node.setdefault(node, []).append(ws)
            self._by_node = by_node
        return self._by_node

    # -- placing -----------------------------------------------------------------------

    def place_checked(self, ws: WorkloadState, tasks: list[int]) -> list[Placement] | str:
        """Place tasks, all or none, and record them as started; a reason if they do not fit.

        Memory-sized fractions take a node-dependent share of a device, so their quotas
        are checked again with the amounts actually placed.
        """
        state = self.state
        mark = state.checkpoint()
        result = self.placer.place(ws, tasks)
        if isinstance(result, Failure):
            return result.reason
        if any(ws.tasks[task].gpu_memory > 0 for task in tasks):
            gpu = sum(placement.gpu for placement in result)
            exact = (
                gpu,
                sum(ws.tasks[task].cpu for task in tasks),
                float(sum(ws.tasks[task].memory for task in tasks)),
            )
            state.rollback(mark)
            reason = quota_block(ws, exact)
            if reason is not None:
                return reason
            for placement in result:
                state.bind(ws, placement)
        self.record_start(ws, result)
        return result

    def record_start(self, ws: WorkloadState, placements: Iterable[Placement]) -> None:
        """Record that tasks of `ws` start this cycle where `placements` say."""
        if not ws.started and not ws.original and ws.preemptible:
            queue = ws.queue.name
            self._new_starts.setdefault(queue, []).append(ws)
            self._unordered[queue] = self._unordered.get(queue, 0) + 1
        for placement in placements:
            ws.started[placement.task] = placement
        self.changes += 1

    def new_starts_of(self, queue: str) -> list[WorkloadState]:
        """The preemptible work `queue` started in this cycle, in the order it would be
        taken off again (`start_order`; the caller may drop some from the front).

        The work is put in order when asked for, not as it starts: most cycles never ask
        (nothing is reclaimed or preempted), and an insertion in order worked out the
        sort keys of the entries it was compared with, tens of times per start in a
        large cycle. Either way ties stay in the order started."""
        starts = self._new_starts.get(queue)
        if starts is None:
            return []
        added = self._unordered.pop(queue, 0)
        if added * 8 >= len(starts):
            starts.sort(key=start_order)
        elif added:
            # A few since it was last asked for (one per preemption): each in its place.
            tail = starts[-added:]
            del starts[-added:]
            for ws in tail:
                insort(starts, ws, key=start_order)
        return starts

    def withdrawable(self, ws: WorkloadState) -> bool:
        """Whether `ws`, started in this cycle, may be taken off again at no cost: it is
        preemptible, runs only what it started, and nothing was evicted or moved for it
        (taking it off would waste that)."""
        return (
            ws.preemptible
            and bool(ws.running)
            and len(ws.running) == len(ws.started)
            and not self.never_withdrawn(ws)
        )

    def never_withdrawn(self, ws: WorkloadState) -> bool:
        """Whether `ws` may not be taken off again for the rest of the cycle."""
        return not ws.preemptible or ws.name in self.touched or ws.name in self.served

    # -- pending work, for consolidate, reclaim and preempt ----------------------------

    def gang_candidate(self, ws: WorkloadState) -> Candidate:
        """The minimum gang of a workload with no task running, as a candidate."""
        # Only asked for workloads with no task running, so the request is nominal (and
        # stays the same while the state is kept, on the same nodes).
        candidate = ws.gang
        if candidate is None:
            tasks = list(range(ws.workload.min_tasks))
            candidate = ws.gang = Candidate(ws, tasks, self.request_of(ws, tasks), growth=False)
        return candidate

    def pending(self) -> Sequence[Candidate]:
        """The candidates of `pending_in_order`, in no particular order (worked out again
        only when something was started, evicted or moved since)."""
        touched = self.touched
        mark = (self.changes, len(touched))
        if self._pending is not None and self._pending[0] == mark:
            return self._pending[1]
        found = [
            ws.gang or self.gang_candidate(ws)
            for ws in self.waiting
            if not ws.running and not ws.started and ws.name not in touched
        ]
        self._pending = (mark, found)
        return found

    def pending_in_order(self) -> InOrder:
        """Pending workloads not yet placed, evicted or moved, in fairness order."""
        return InOrder(list(self.queues.values()), self.pending())

    # -- what was decided --------------------------------------------------------------

    @staticmethod
    def note(ws: WorkloadState, note: str) -> None:
        """Add what a later action found to the workload's pending reason."""
        ws.reason = f"{ws.reason}; {note}" if ws.reason else note

    def record_eviction(
        self,
        ws: WorkloadState,
        tasks: tuple[int, ...],
        kind: EvictionKind,
        by: WorkloadState,
        why: str,
    ) -> None:
        """Record that `tasks` of `ws` were evicted (or moved) for `by`. Work started
        earlier in this cycle is only taken off again: it loses nothing, so it is no
        eviction, and it waits without being tried again in this cycle."""
        if ws.original:
            self.evictions.append(Eviction(ws.name, tasks, kind, by.name, why))
            self.evicted[ws.name] = f"{EVICTED[kind]} for {by.name}: {why}"
        else:
            for task in tasks:
                del ws.started[task]
            ws.reason = f"{EVICTED[kind]} for {by.name} before it started: {why}"
        self.touched.add(ws.name)
        self.served.add(by.name)
        self.changes += 1
        self.settled = False


def start_order(ws: WorkloadState) -> tuple[int, float, str]:
    """The order in which work started this cycle is taken off again: the lowest priority
    first, then the newest, then by name."""
    workload = ws.workload
    return (workload.priority, -workload.submitted, workload.name)
