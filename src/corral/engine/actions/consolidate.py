"""Consolidate: move preemptible workloads between nodes when that lets a pending one
fit. Every moved workload is placed again in the same cycle: no net eviction."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator

from corral.engine.kinds import GPU
from corral.engine.placement import Failure
from corral.engine.quota import quota_block, within_quota
from corral.engine.session import Session
from corral.engine.state import Allowed, Candidate, NodeState, WorkloadState, natural_key
from corral.model import Placement
from corral.model.resources import EPSILON

# Records a tentative placement made by moves: the tasks started and the moves.
Commit = Callable[[], None]


class Consolidate:
    """Make room for pending work by moving running work, never by evicting it."""

    def __init__(self, session: Session) -> None:
        self.session = session
        # The workloads running on each node as the cycle began, newest first.
        self._newest_first: dict[str, list[WorkloadState]] = {}

    def run(self) -> None:
        """Move preemptible workloads between nodes when that lets a pending one fit."""
        session = self.session
        # Moves keep the queues' totals and the free GPUs as they are, and a placement only
        # adds to them, so work that cannot be helped now cannot be later in this action.
        # (The free GPUs first, inline: in a full cluster most pending work fails there.)
        free = session.state.free_gpu + EPSILON
        if not any(
            candidate.request[GPU] <= free and self._may_help(candidate)
            for candidate in session.pending()
        ):
            return
        order = session.pending_in_order()
        for candidate in order:
            if self._may_help(candidate):
                commit = self.moves_for(candidate)
                if commit is not None:
                    commit()
                    session.state.journal.clear()
                    continue
            # Nothing changed: alike work next in its queue fares the same.
            for _ in order.take_alike(candidate):
                pass

    def _may_help(self, candidate: Candidate) -> bool:
        ws = candidate.workload
        topology = ws.workload.topology
        # Moves keep every workload placed, so only capacity free somewhere can help; it
        # may sit on nodes the candidate cannot use, where moved work can go. (Cheapest
        # check first: in a full cluster most pending work fails it.)
        return (
            candidate.request[GPU] <= self.session.state.free_gpu + EPSILON
            and (topology is None or topology.required)
            and quota_block(ws, candidate.request) is None
        )

    def moves_for(self, candidate: Candidate) -> Commit | None:
        """Place the candidate in the tentative state by moving running work, every moved
        workload placed again; returns what records it all (the tasks started and the
        moves), or None with the state as it was. A gang that requires one topology
        domain is tried in each domain big enough for it, the one with most free first."""
        ws = candidate.workload
        tasks = candidate.tasks
        allowed = self.session.placer.allowed_for(ws)
        topology = ws.workload.topology
        if topology is None:
            return self._moves_within(ws, tasks, allowed)
        if not topology.required:
            return None
        for members in self._domains(candidate, topology.key, allowed):
            commit = self._moves_within(ws, tasks, members)
            if commit is not None:
                return commit
        return None

    def _domains(self, candidate: Candidate, key: str, allowed: Allowed) -> list[frozenset[int]]:
        """Domains of label `key` with GPUs enough for the candidate, the most GPUs free
        first, then by name."""
        nodes = self.session.state.nodes
        ranked = []
        for value, members in self.session.placer.domains(key, allowed).items():
            size = sum(nodes[index].node.gpus for index in members)
            if size + EPSILON < candidate.request[GPU]:
                continue
            free = sum(nodes[index].free_gpu for index in members)
            ranked.append((-free, natural_key(value), members))
        ranked.sort(key=lambda item: (item[0], item[1]))
        return [members for _, _, members in ranked]

    def _moves_within(self, ws: WorkloadState, tasks: list[int], allowed: Allowed) -> Commit | None:
        session = self.session
        state = session.state
        mark = state.checkpoint()
        moved: list[WorkloadState] = []
        placed: list[Placement] = []
        for task in tasks:
            placement = session.placer.place_task(ws.tasks[task], task, allowed)
            if placement is None:
                placement = self._make_room(ws, task, allowed, moved)
            if placement is None:
                state.rollback(mark)
                return None
            state.bind(ws, placement)
            placed.append(placement)
        if not within_quota(ws):
            # Memory-sized fractions may have taken more of a device than estimated.
            state.rollback(mark)
            return None
        replaced: dict[str, list[Placement]] = {}
        for mover in moved:
            result = session.placer.place(mover, sorted(mover.original))
            # A memory-sized fraction may take a larger share of a smaller device.
            if isinstance(result, Failure) or not within_quota(mover):
                state.rollback(mark)
                return None
            replaced[mover.name] = result

        def commit() -> None:
            session.record_start(ws, placed)
            for mover in moved:
                reason = f"moved to another node to make room for {ws.name}"
                tasks_moved = tuple(sorted(mover.original))
                session.record_eviction(mover, tasks_moved, "consolidate", ws, reason)
                session.record_start(mover, replaced[mover.name])

        return commit

    def _make_room(
        self, ws: WorkloadState, task: int, allowed: Allowed, moved: list[WorkloadState]
    ) -> Placement | None:
        """Take movable workloads off one node (tentatively) until `task` fits there."""
        session = self.session
        if not session.by_node:
            # Only work that ran as the cycle began moves: with none (a cluster filling up
            # from empty), no node has any, and ranking every node would find nothing.
            return None
        config = session.config
        state = session.state
        group = ws.tasks[task]
        nodes = [
            node
            for node in session.placer.nodes_of(allowed)
            if node.node.gpus >= math.ceil(group.gpu)
        ]
        for node in self._first_nodes(nodes, config.consolidate_max_nodes):
            mark = state.checkpoint()
            movers = [
                other
                for other in session.by_node.get(node.name, [])
                if self._movable(other) and other not in moved
            ]
            movers.sort(
                key=lambda other: (
                    session.request_of(other, list(other.running))[GPU],
                    -other.workload.submitted,
                )
            )
            taken = []
            only_here = frozenset((node.index,))
            for other in movers[: config.consolidate_max_moves]:
                for running in list(other.running):
                    state.unbind(other, running)
                taken.append(other)
                placement = session.placer.place_task(group, task, only_here)
                if placement is not None:
                    moved.extend(taken)
                    return placement
            state.rollback(mark)
        return None

    def _first_nodes(self, nodes: list[NodeState], most: int) -> Iterator[NodeState]:
        """The first `most` of `nodes` to try, one at a time: most free capacity first;
        between equals, the node whose movable work is newest, since the newest work is
        the first to be disturbed everywhere else too; then by index.

        Ranking every node is slow and the first node tried mostly makes room, so nodes
        are ranked one level of free capacity at a time, the most free first (the state
        is as it was whenever the next node is asked for: a node tried is rolled back).
        Within a level each node starts ranked by its newest work, movable or not (never
        older than its newest movable work), and the node in front has its movable work
        looked at: it is in its place when its newest work is movable (as most is), else
        it goes back ranked by what is."""
        if most <= 0:
            return
        levels: dict[float, list[NodeState]] = {}
        for node in nodes:
            level = levels.get(node.free_gpu)
            if level is None:
                levels[node.free_gpu] = [node]
            else:
                level.append(node)
        for free in sorted(levels, reverse=True):
            heap = []
            for node in levels[free]:
                newest = self._newest_first_on(node.name)
                bound = newest[0].workload.submitted if newest else -math.inf
                heap.append((-bound, node.index, node))
            heapq.heapify(heap)
            while heap:
                bound, index, node = heap[0]
                exact = -self._newest_movable(node.name)
                if exact != bound:
                    heapq.heapreplace(heap, (exact, index, node))
                    continue
                heapq.heappop(heap)
                yield node
                most -= 1
                if most == 0:
                    return

    def _newest_first_on(self, node: str) -> list[WorkloadState]:
        """The workloads running on the node as the cycle began, newest first."""
        newest = self._newest_first.get(node)
        if newest is None:
            on_node = self.session.by_node.get(node, [])
            newest = self._newest_first[node] = sorted(
                on_node, key=lambda ws: ws.workload.submitted, reverse=True
            )
        return newest

    def _newest_movable(self, node: str) -> float:
        """When the newest movable workload on the node was submitted (-inf: none)."""
        # Most work is movable: the first movable one is usually the first.
        for ws in self._newest_first_on(node):
            if self._movable(ws):
                return ws.workload.submitted
        return -math.inf

    def _movable(self, ws: WorkloadState) -> bool:
        return (
            ws.preemptible
            and ws.name not in self.session.touched
            and not ws.started
            and bool(ws.original)
            and len(ws.running) == len(ws.original)
        )
