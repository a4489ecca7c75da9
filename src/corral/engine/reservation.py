"""Reservations: backfill, so that large gangs do not starve behind small jobs.

A queue may set `reserve_after` (inherited down the tree). When the head of a leaf queue
(its first pending workload: highest priority, then oldest) has waited at least that
long, it gets a reservation before any action of the cycle places work: the nodes where
it would fit soonest, found by letting running work end in the order of its expected end
(its max runtime less the time it has run), or where it fits now. Until the cycle ends,
no other work is placed on those nodes (by any action) unless its own max runtime ends
before the reservation's expected start: that is backfill. As the nodes drain, the gang
starts there. Heads that wait longest reserve first, so two do not count on one node.

Work with no max runtime has no known end: it is taken to end after every known end. A
reservation that has to wait for such work has no expected start, and its nodes take no
new work at all (nothing can be shown to end before it), so they drain.

Nothing is kept between cycles: each cycle finds the reservations again from its
snapshot (`Workload.waiting_for`, `running_for`, `max_runtime`), so the engine stays pure.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from corral.engine.kinds import Request
from corral.engine.placement import Failure, Placer
from corral.engine.quota import quota_block
from corral.engine.state import ClusterState, WorkloadState, natural_key
from corral.model import Reservation
from corral.model.durations import format_duration
from corral.model.resources import EPSILON


@dataclass(frozen=True, slots=True)
class _Held:
    workload: WorkloadState
    nodes: frozenset[int]
    starts_in: float | None


def expected_end(ws: WorkloadState) -> float | None:
    """Seconds from now until `ws` ends by its max runtime, if placed or running now;
    None when it has no max runtime. Work started this cycle runs its whole max runtime;
    work that was running has run `running_for` of it (unknown counts as just started)."""
    limit = ws.workload.max_runtime
    if limit is None:
        return None
    ran = ws.workload.running_for if ws.original else None
    return max(limit - (ran or 0.0), 0.0)


class Reservations:
    """The reservations made in one cycle, and the nodes they hold against other work."""

    def __init__(self, state: ClusterState, placer: Placer, workloads: list[WorkloadState]) -> None:
        self.state = state
        self.placer = placer
        self.workloads = workloads
        self._held: list[_Held] = []

    def hold_for(self, ws: WorkloadState) -> frozenset[int]:
        """Node indices `ws` may not use this cycle: those reserved for other workloads
        whose expected start comes before `ws` would end."""
        if not self._held:
            return frozenset()
        end = expected_end(ws)
        held: set[int] = set()
        for reservation in self._held:
            if reservation.workload is ws or reservation.workload.running:
                # Its own, or one whose workload is placed (perhaps only tentatively, in an
                # attempt that may be rolled back: so it is skipped, not dropped): the
                # rest of those nodes is free for anyone meanwhile.
                continue
            start = reservation.starts_in
            if end is not None and start is not None and end <= start + EPSILON:
                continue  # backfill: it ends before the reserved nodes are needed
            held |= reservation.nodes
        return frozenset(held)

    def reserve(self, waiting: list[WorkloadState]) -> None:
        """Before any action places work: give the head of each queue that reserves (its
        first pending workload: highest priority, then oldest) a reservation when it has
        waited long enough, the longest-waiting first. A head that fits now is given the
        nodes it fits on, so that work after it in the cycle does not take them first."""
        heads: dict[str, WorkloadState] = {}
        for ws in waiting:
            queue = ws.queue
            if queue.reserve_after <= 0 or ws.running:
                continue
            head = heads.get(queue.name)
            if head is None or _in_queue_order(ws) < _in_queue_order(head):
                heads[queue.name] = ws
        due = [
            ws
            for ws in heads.values()
            if ws.workload.waiting_for is not None
            and ws.workload.waiting_for >= ws.queue.reserve_after
        ]
        due.sort(key=lambda ws: (-ws.workload.priority, -(ws.workload.waiting_for or 0.0), ws.name))
        # Running work by expected end, sorted once for every head (unknown ends last).
        ending: list[tuple[float, str, WorkloadState]] = []
        if due:
            for other in self.workloads:
                if other.running:
                    end = expected_end(other)
                    ending.append((math.inf if end is None else end, other.name, other))
            ending.sort(key=lambda item: (item[0], item[1]))
        for ws in due:
            tasks = list(range(ws.workload.min_tasks))
            request = _request(self.placer, ws, tasks)
            if quota_block(ws, request) is not None or self.placer.too_big(ws, tasks):
                continue
            found = self._soonest(ws, tasks, request[0], ending)
            if found is not None:
                self._held.append(_Held(ws, found[0], found[1]))

    def decided(self) -> dict[str, Reservation]:
        """The reservations of workloads still pending at the end of the cycle."""
        nodes = self.state.nodes
        return {
            held.workload.name: Reservation(
                held.workload.name,
                tuple(sorted((nodes[index].name for index in held.nodes), key=natural_key)),
                None if held.starts_in is None else round(held.starts_in, 3),
            )
            for held in self._held
            if not held.workload.running
        }

    def annotate(
        self,
        pending: dict[str, str],
        reservations: dict[str, Reservation],
        evicted: dict[str, str],
    ) -> None:
        """Add to the pending reasons the reservation a workload holds, or the
        reservations that kept it off nodes."""
        nodes = self.state.nodes
        for ws in self.workloads:
            name = ws.name
            if name not in pending or name in evicted:
                continue
            own = reservations.get(name)
            if own is not None:
                pending[name] = f"{pending[name]}; {describe(own)}"
                continue
            held = self.hold_for(ws)
            if held:
                holders = ", ".join(sorted({h.workload.name for h in self._held if h.nodes & held}))
                names = ",".join(sorted((nodes[i].name for i in held), key=natural_key))
                pending[name] = f"{pending[name]}; reserved for {holders}: {names}"

    def _soonest(
        self,
        ws: WorkloadState,
        tasks: list[int],
        need: float,
        ending: list[tuple[float, str, WorkloadState]],
    ) -> tuple[frozenset[int], float | None] | None:
        """The nodes where the gang would fit soonest and when (seconds from now, 0 when
        it fits now), by taking running work off in the order of its expected end; None
        when it fits nowhere even once all of it has ended (other reservations hold the
        room). `ending`: the running work in the order of its expected end."""
        state = self.state
        # Work on nodes the gang may not use (its node selector, or reserved for a head
        # before it) frees no room for it.
        eligible = self.placer.allowed_for(ws)
        # Read lazily: the gang usually fits long before the last end.
        ended = (
            (end, other)
            for end, _, other in ending
            if other is not ws
            and (
                eligible is None
                or any(state.by_name[p.node].index in eligible for p in other.running.values())
            )
        )
        mark = state.checkpoint()
        found: tuple[frozenset[int], float | None] | None = None
        try:
            # First as things are (end 0), then after each expected end in turn: work that
            # ends together frees its room together.
            groups = itertools.chain(
                [(0.0, iter(()))], itertools.groupby(ended, key=lambda item: item[0])
            )
            for end, together in groups:
                for _, other in together:
                    for task in list(other.running):
                        state.unbind(other, task)
                if state.free_gpu + EPSILON < need:
                    continue
                result = self.placer.place(ws, tasks)
                if not isinstance(result, Failure):
                    nodes = frozenset(state.by_name[p.node].index for p in result)
                    found = (nodes, None if math.isinf(end) else end)
                    break
        finally:
            state.rollback(mark)
        return found


def describe(reservation: Reservation) -> str:
    """ "reserved nodes n1,n2 from ~1h30m from now", for a pending reason."""
    names = ",".join(reservation.nodes)
    if reservation.starts_in is None:
        return f"reserved nodes {names} when work with no max runtime ends"
    if reservation.starts_in <= 0:
        return f"reserved nodes {names}, free now"
    return f"reserved nodes {names} from ~{format_duration(reservation.starts_in) or '0s'} from now"


def _in_queue_order(ws: WorkloadState) -> tuple[int, float, str]:
    """A workload's place in its leaf queue: higher priority, then older, first."""
    return (-ws.workload.priority, ws.workload.submitted, ws.name)


def _request(placer: Placer, ws: WorkloadState, tasks: list[int]) -> Request:
    gpu = sum(placer.nominal_gpu(ws.tasks[task]) for task in tasks)
    cpu = sum(ws.tasks[task].cpu for task in tasks)
    memory = float(sum(ws.tasks[task].memory for task in tasks))
    return (gpu, cpu, memory)
