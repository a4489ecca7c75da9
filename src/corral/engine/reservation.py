"""Reservations: backfill, so that large gangs do not starve behind small jobs.

A queue may set `reserve_after` (inherited down the tree). When the first workload of a
leaf queue that allocate could not place (the head of its queue) has waited at least
that long, it gets a reservation: the nodes where it would fit soonest, found by letting
running work end in the order of its expected end (its max runtime less the time it has
run). Until the cycle ends, no other work is placed on those nodes unless its own max
runtime ends before the reservation's expected start: that is backfill. As the nodes
drain, the gang starts there.

Work with no max runtime has no known end: it is taken to end after every known end. A
reservation that has to wait for such work has no expected start, and its nodes take no
new work at all (nothing can be shown to end before it), so they drain.

Nothing is kept between cycles: each cycle finds the reservations again from its
snapshot (`Workload.waiting_for`, `running_for`, `max_runtime`), so the engine stays pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.engine.placement import Failure, Placer
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
        # Leaf queues whose head has been considered this cycle.
        self._considered: set[str] = set()
        self._cache: dict[int, frozenset[int]] = {}

    def hold_for(self, ws: WorkloadState) -> frozenset[int]:
        """Node indices `ws` may not use this cycle: those reserved for other workloads
        whose expected start comes before `ws` would end."""
        if not self._held:
            return frozenset()
        end = expected_end(ws)
        held: set[int] = set()
        for reservation in self._held:
            if reservation.workload is ws:
                continue
            start = reservation.starts_in
            if end is not None and start is not None and end <= start + EPSILON:
                continue  # backfill: it ends before the reserved nodes are needed
            held |= reservation.nodes
        return frozenset(held)

    def consider(self, ws: WorkloadState, tasks: list[int]) -> None:
        """Called when allocate could not place the gang `tasks` of `ws` for want of room:
        if `ws` heads its queue and has waited long enough, reserve nodes for it."""
        queue = ws.queue
        if queue.reserve_after <= 0 or queue.name in self._considered:
            return
        self._considered.add(queue.name)
        waited = ws.workload.waiting_for
        if waited is None or waited < queue.reserve_after:
            return
        found = self._soonest(ws, tasks)
        if found is None:
            return
        nodes, starts_in = found
        self._held.append(_Held(ws, nodes, starts_in))
        names = ",".join(self.state.nodes[index].name for index in sorted(nodes))
        when = (
            "when work with no max runtime ends"
            if starts_in is None
            else f"from ~{format_duration(starts_in) or '0s'} from now"
        )
        note = f"reserved nodes {names} {when}"
        ws.reason = f"{ws.reason}; {note}" if ws.reason else note

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

    def _soonest(
        self, ws: WorkloadState, tasks: list[int]
    ) -> tuple[frozenset[int], float | None] | None:
        """The nodes where the gang would fit soonest and when (seconds from now), by
        taking running work off in the order of its expected end; None when it fits
        nowhere even once all of it has ended (other reservations hold the room)."""
        state = self.state
        eligible = self.placer.eligible(ws)
        need = sum(self.placer.nominal_gpu(ws.tasks[task]) for task in tasks)
        ending: list[tuple[float, str, WorkloadState]] = []
        for other in self.workloads:
            if not other.running or other is ws:
                continue
            if eligible is not None and not any(
                state.by_name[p.node].index in eligible for p in other.running.values()
            ):
                continue
            end = expected_end(other)
            ending.append((math.inf if end is None else end, other.name, other))
        ending.sort(key=lambda item: (item[0], item[1]))
        mark = state.checkpoint()
        found: tuple[frozenset[int], float | None] | None = None
        try:
            for at, (end, _, other) in enumerate(ending):
                for task in list(other.running):
                    state.unbind(other, task)
                if at + 1 < len(ending) and ending[at + 1][0] == end:
                    continue  # work that ends together frees its room together
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
