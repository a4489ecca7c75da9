"""Preempt: within one queue, higher-priority work evicts lower-priority preemptible work."""

from __future__ import annotations

import math

from corral.engine.eviction import Unit, VictimSearch
from corral.engine.quota import deserved_block
from corral.engine.session import Session
from corral.engine.state import Candidate, WorkloadState


class Preempt:
    """Evict lower-priority preemptible work of a queue for its higher-priority work."""

    def __init__(self, session: Session, victims: VictimSearch) -> None:
        self.session = session
        self.victims = victims

    @staticmethod
    def could_preempt(priority: float, lowest_running: float) -> bool:
        """Whether pending work of `priority` could preempt anything in a queue whose
        lowest-priority preemptible running work has `lowest_running` (math.inf when it
        has none): only work of a lower priority is a victim. Cheap, for the simulator."""
        return priority > lowest_running

    def run(self) -> None:
        """Within one queue, higher-priority work evicts lower-priority preemptible work."""
        session = self.session
        # Only work above the lowest priority running in its queue can preempt, or be told
        # why it could not.
        floors: dict[str, float] = {}
        if session.settled:
            for candidate in session.pending():
                queue = candidate.workload.queue
                floor = floors.get(queue.name)
                if floor is None:
                    floor = floors[queue.name] = min(queue.running_priorities, default=math.inf)
                if self.could_preempt(candidate.workload.workload.priority, floor):
                    break
            else:
                # The rest would only try to fit as things are, which allocate found they
                # do not (nothing was freed since; placement is greedy, so for a gang of
                # unlike tasks this could in contrived cases miss a fit that a fuller
                # state allows).
                return
        order = session.pending_in_order()
        for candidate in order:
            # Victims are preemptible, so evicting them never makes room within deserved.
            if deserved_block(candidate.workload, candidate.request) is not None:
                note = None
            else:
                placed, note = self._preempt_for(candidate)
                if placed:
                    continue
            # Nothing changed: alike work next in its queue fares the same.
            for alike in order.take_alike(candidate):
                if note:
                    session.note(alike.workload, note)

    def _preempt_for(self, candidate: Candidate) -> tuple[bool, str | None]:
        """Evict lower-priority units of the candidate's queue until it fits; say why not
        when its queue runs lower-priority work that could not make room. Returns whether
        it was placed, and what was said."""
        ws = candidate.workload
        priority = ws.workload.priority
        if not self.could_preempt(priority, min(ws.queue.running_priorities, default=math.inf)):
            # Nothing below it runs in its queue, so there is no victim: only a try as
            # things are (what the search below would make, and nothing more).
            placed, _ = self.victims.evict_for(candidate, lambda: None, "preempt")
            return placed, None

        def next_victim() -> Unit | None:
            return self.victims.first_unit(ws.queue, ws, priority)

        placed, _ = self.victims.evict_for(candidate, next_victim, "preempt")
        if not placed and self._runs_lower(ws, priority):
            note = (
                f"cannot preempt: the lower-priority work in queue {ws.queue.name} is "
                "non-preemptible or would not make room"
            )
            self.session.note(ws, note)
            return False, note
        return placed, None

    def _runs_lower(self, ws: WorkloadState, priority: int) -> bool:
        """Whether work below `priority` runs in the workload's queue."""
        return any(
            other.running and other.workload.priority < priority
            for other in self.session.workloads
            if other.queue is ws.queue
        )
