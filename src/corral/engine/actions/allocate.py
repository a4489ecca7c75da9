"""Allocate: place pending workloads and grow elastic ones, in fairness order, without
evicting anything."""

from __future__ import annotations

from corral.engine.kinds import GPU
from corral.engine.ordering import FairOrder
from corral.engine.quota import quota_block
from corral.engine.session import Session
from corral.engine.state import Candidate, WorkloadState
from corral.model.resources import EPSILON, plural_gpus


class Allocate:
    """Place what fits as things are."""

    def __init__(self, session: Session) -> None:
        self.session = session

    @staticmethod
    def could_place(
        gpus: float, limit_room: float, free_gpu: float, slack: float = EPSILON
    ) -> bool:
        """A cheap necessary condition (for the simulator) for any action to place a
        pending workload of `gpus` GPUs without evicting: it fits under its queues' GPU
        limits (`limit_room`, the least room left under any of them) and in the GPUs free
        in the whole cluster."""
        return gpus <= min(limit_room, free_gpu) + slack

    def run(self) -> None:
        """Place pending workloads and grow elastic ones, in fairness order."""
        session = self.session
        order = FairOrder()
        for ws in session.in_play():
            if not ws.running:
                order.add(session.gang_candidate(ws))
            elif len(ws.running) < len(ws.tasks) and ws.workload.elastic:
                order.add(self._growth_candidate(ws))
        order.refresh_all(list(session.queues.values()))
        # Reservations hold nodes against some workloads and not others: alike ones may
        # then fare differently.
        batches = session.reservations is None
        while (candidate := order.pop()) is not None:
            ws = candidate.workload
            if self._try_place(candidate):
                if ws.workload.elastic and ws.unplaced():
                    order.add(self._growth_candidate(ws))
            elif batches and not candidate.growth:
                # A backlog of alike work costs one attempt: the state is as it was.
                for alike in order.take_alike(candidate):
                    alike.workload.reason = ws.reason
            order.refresh(ws.queue)
        session.settled = True

    def _growth_candidate(self, ws: WorkloadState) -> Candidate:
        tasks = ws.unplaced()[:1]
        return Candidate(ws, tasks, self.session.request_of(ws, tasks), growth=True)

    def _try_place(self, candidate: Candidate) -> bool:
        session = self.session
        ws = candidate.workload
        reason = quota_block(ws, candidate.request)
        if reason is None and not candidate.growth:
            if not ws.sized:
                # The minimum gang and the nodes stay the same while the state is kept.
                ws.never_fits = session.placer.too_big(ws, candidate.tasks)
                ws.sized = True
            reason = ws.never_fits
        free_gpu = session.state.free_gpu
        if reason is None and candidate.request[GPU] > free_gpu + EPSILON:
            reason = (
                f"needs {plural_gpus(candidate.request[GPU])}; the cluster has "
                f"{plural_gpus(max(free_gpu, 0.0))} free"
            )
        if reason is None:
            result = session.place_checked(ws, candidate.tasks)
            if not isinstance(result, str):
                session.state.journal.clear()
                return True
            reason = result
        if not candidate.growth:
            ws.reason = reason
        return False
