"""Reclaim: queues under their fair share take GPUs back from queues above theirs.

Victims come in queue order (queues over their fair share first, the lowest queue
priority first among them, then the most over-served; then its own order).
When those would not make room, as when they free GPUs spread over nodes where the
candidate needs them together, the same victims are tried node by node, the nodes with
the most GPUs free or held by queues that may give first.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from itertools import compress
from operator import attrgetter, itemgetter, ne

from corral.engine.eviction import MakeRoom, NextVictim, Unit, VictimSearch
from corral.engine.kinds import CPU, DIMENSIONS, GPU, MEMORY, Request
from corral.engine.quota import (
    above_deserved_at_share,
    all_above_deserved,
    all_over,
    amount_text,
    first_over,
    over_fair_share,
    quota_block,
    served_ratio,
    within_deserved,
    within_fair_share,
)
from corral.engine.session import Session
from corral.engine.state import Candidate, QueueState, WorkloadState, natural_key
from corral.model.resources import EPSILON

# Whether a leaf other than a reclaimer's may give what the reclaimer asks for, by
# (reclaimer's queue, asks for GPU, CPU, memory, stays within its deserved quota).
AnyoneOver = dict[tuple[str, bool, bool, bool, bool], bool]
# A leaf's rank among the queues that may give: queues over their fair share before those
# that only hold more than they deserve (for a reclaimer under its deserved quota); lower
# queue priority first (the priorities of its path from where it meets the reclaimer down
# to the leaf, compared top-down); the most over-served, the most GPUs held, then by name.
GiverRank = tuple[int, tuple[int, ...], float, float, tuple[object, ...]]
# A ranked giver: its rank, its place among the queues (which orders leaves of equal
# rank, as "q1" and "q01"), the leaf, and the queue its path takes below the queue where
# it meets the reclaimer (a reclaimer's own branch there gives nothing at that meeting).
Ranked = tuple[GiverRank, int, QueueState, QueueState]
# The order of ranked givers.
_ORDER = itemgetter(0, 1)
_STAMP = attrgetter("stamp")


class Reclaim:
    """Take back from queues over their fair share for pending work within its own."""

    def __init__(
        self, session: Session, victims: VictimSearch, moves: MakeRoom | None = None
    ) -> None:
        """`moves`: how to move running work to make room (consolidation), when the cycle
        consolidates; reclaim then tries it before it gives up."""
        self.session = session
        self.victims = victims
        self.moves = moves
        self._name_keys: dict[str, tuple[object, ...]] = {}
        # The leaves below a queue (None: every leaf) ranked as givers of the resources
        # asked for, with or without the guarantee's tier (see `_Givers`).
        self._groups: dict[tuple[str | None, tuple[int, ...], bool], _Givers] = {}

    @staticmethod
    def could_take(
        gpus: float, alloc_gpu: float, fair_share_gpu: float, slack: float = EPSILON
    ) -> bool:
        """A cheap necessary condition on GPUs alone (for the simulator) for reclaiming for
        a pending workload of `gpus` GPUs: its queue, holding `alloc_gpu`, stays within
        its fair share with it (work that asks for no GPU always may). It also needs some
        other leaf queue over its fair share (`quota.over_fair_share`)."""
        return gpus <= EPSILON or alloc_gpu + gpus <= fair_share_gpu + slack

    def run(self) -> None:
        """Queues under their fair share take GPUs back from queues above theirs."""
        session = self.session
        if not session.pending() and not session.state.elastic_running:
            # Nothing to reclaim for (the cheapest test first).
            return
        if not any(
            queue.leaf
            and (
                over_fair_share(queue.alloc, queue.fair_share)
                or above_deserved_at_share(queue.alloc, queue.deserved, queue.fair_share)
            )
            for queue in session.queues.values()
        ):
            return
        # Whether another queue is over its fair share changes only when a reclaim is made.
        anyone_over: AnyoneOver = {}
        # As things stand, how far each candidate reaches depends only on its queue, its
        # request and whether it is preemptible: a backlog of alike work is looked at once.
        reaches: dict[tuple[QueueState, Request, bool], int | None] = {}
        candidates = []
        for candidate in session.pending():
            ws = candidate.workload
            key = (ws.queue, candidate.request, ws.workload.preemptible)
            reach = reaches.get(key, -1)
            if reach == -1:
                reach = reaches[key] = self._reach(candidate, anyone_over)
            if reach == 0:
                candidates.append((candidate, key))
        if not any(reaches.values()):
            # Nothing is reclaimed, so the state stays as it is and the order is moot.
            notes: dict[tuple[QueueState, Request, bool], str] = {}
            for candidate, key in candidates:
                note = notes.get(key)
                if note is None:
                    note = notes[key] = self._within_note(candidate)
                session.note(candidate.workload, note)
        else:
            order = session.pending_in_order()
            for candidate in order:
                reach = self._reach(candidate, anyone_over)
                note = None
                if reach == 0:
                    note = self._within_note(candidate)
                elif reach is not None:
                    note = self._reclaim_for(candidate, reach)
                    if note is None:
                        anyone_over.clear()
                        continue
                # Nothing changed: alike work next in its queue fares the same.
                for alike in (candidate, *order.take_alike(candidate)):
                    if note:
                        session.note(alike.workload, note)
        self._grow(anyone_over)

    def _grow(self, anyone_over: AnyoneOver) -> None:
        """Running elastic workloads grow by reclaim, one task at a time, while their
        queues stay within their fair share (pending work was served first)."""
        session = self.session
        if not session.state.elastic_running:
            return
        for ws in session.workloads:
            # Most work is not elastic: the cheapest test first.
            if ws.workload.min_available is None or not ws.running:
                continue
            if not ws.workload.elastic or ws.name in session.touched:
                continue
            while tasks := ws.unplaced()[:1]:
                candidate = Candidate(ws, tasks, session.request_of(ws, tasks), growth=True)
                reach = self._reach(candidate, anyone_over)
                if not reach or self._reclaim_for(candidate, reach) is not None:
                    break
                anyone_over.clear()

    def _reclaim_for(self, candidate: Candidate, reach: int) -> str | None:
        """Evict victims of queues that may give until the candidate fits. Returns None
        when it was placed, else why not for its pending reason ("" for the growth of a
        running workload, which keeps the reason it has)."""
        evict_for = self.victims.evict_for
        placed, tried = evict_for(candidate, self._victims(candidate, reach), "reclaim")
        if not placed and tried and candidate.request[GPU] > EPSILON:
            # Victims in queue order may free GPUs spread over nodes where the
            # candidate's tasks need them together: try again node by node.
            by_node = self._victims(candidate, reach, by_node=True)
            placed, _ = evict_for(candidate, by_node, "reclaim")
            if not placed and self.moves is not None:
                # Or they free GPUs enough that moving some running work would gather.
                victims = self._victims(candidate, reach)
                placed, _ = evict_for(candidate, victims, "reclaim", self.moves)
        if placed:
            return None
        if candidate.growth:
            return ""
        if tried:
            return (
                "cannot reclaim: evicting work of queues over their fair share would not make room"
            )
        return (
            "cannot reclaim: no queue it may take from holds preemptible work over its fair share"
        )

    def _reach(self, candidate: Candidate, anyone_over: AnyoneOver) -> int | None:
        """How far up its queue path the candidate stays within fair share (see
        `quota.within_fair_share`); None when reclaim does not apply to it."""
        ws = candidate.workload
        request = candidate.request
        if quota_block(ws, request) is not None:
            return None
        guaranteed = within_deserved(ws.queue, request) > 0
        key = (
            ws.queue.name,
            request[GPU] > EPSILON,
            request[CPU] > EPSILON,
            request[MEMORY] > EPSILON,
            guaranteed,
        )
        anyone = anyone_over.get(key)
        if anyone is None:
            anyone = anyone_over[key] = self._anyone_over_fair_share(ws, request, guaranteed)
        if not anyone:
            return None
        return within_fair_share(ws.queue, request)

    @staticmethod
    def _within_note(candidate: Candidate) -> str:
        """Why the candidate may not reclaim: its queue would exceed its fair share."""
        queue = candidate.workload.queue
        resource = first_over(queue.alloc, candidate.request, queue.fair_share)
        share = amount_text(resource, queue.fair_share[resource])
        return f"cannot reclaim: queue {queue.name} would exceed its fair share of {share}"

    def _anyone_over_fair_share(
        self, ws: WorkloadState, request: Request, guaranteed: bool
    ) -> bool:
        """Whether another leaf may give: one over its fair share, or, for a reclaimer
        that stays within its deserved quota (`guaranteed`), one above its deserved."""
        return any(
            leaf.leaf
            and leaf is not ws.queue
            and (
                over_fair_share(leaf.alloc, leaf.fair_share, request)
                or (
                    guaranteed
                    and above_deserved_at_share(leaf.alloc, leaf.deserved, leaf.fair_share, request)
                )
            )
            for leaf in self.session.queues.values()
        )

    def _victims(self, candidate: Candidate, reach: int, by_node: bool = False) -> NextVictim:
        """Victims for a reclaim, one at a time: the first unit of the first queue that
        may give, in the order of `GiverRank`. `by_node`: only units with a task on one
        node at a time, the nodes with the most GPUs free or held by queues that may give
        first."""
        ws = candidate.workload
        request = candidate.request
        # Below its deserved quota a reclaimer may also take from queues that hold more
        # than they deserve while at their fair share: the guarantee wins over the tie.
        guaranteed = within_deserved(ws.queue, request)
        wanted = tuple(resource for resource in DIMENSIONS if request[resource] > EPSILON)
        givers = self._givers(ws.queue, request, wanted, reach, guaranteed)
        targets: list[int | None] = [None]
        if by_node:
            targets = self._targets(ws, {entry[2].name for entry in givers()})

        def next_victim() -> Unit | None:
            ranked = givers()
            while targets:
                for at, entry in enumerate(ranked):
                    unit = self.victims.first_unit(entry[2], ws, None, targets[0])
                    if unit is not None:
                        self._note_priority(unit, entry, ranked[at + 1 :])
                        return unit
                targets.pop(0)
                # Units passed over for being on another node may be on the next one.
                self.victims.forget_passed_over()
            return None

        return next_victim

    def _givers(
        self,
        queue: QueueState,
        request: Request,
        wanted: tuple[int, ...],
        reach: int,
        guaranteed: int,
    ) -> Callable[[], list[Ranked]]:
        """The leaves that may give to a reclaimer of `queue` that stays within its fair
        share up to `reach` queues of its path and within its deserved quota up to
        `guaranteed`, as a function that ranks them as they stand when called: among those
        over their fair share, the lowest queue priority first (see `GiverRank`).

        A victim's branch must split from the reclaimer's at an ancestor below which the
        reclaimer stays within its fair share (the root counts when all of it does): the
        leaves met at `queue.path[m]` are those below it but not below `queue.path[m -
        1]`, ranked by their path below it. Those groups are shared by every reclaimer
        that meets them there, and each keeps its ranks until its queues' totals change."""
        path = queue.path
        parts = [
            (self._group(path[meet], wanted, meet <= guaranteed), path[meet - 1])
            for meet in range(1, min(reach, len(path) - 1) + 1)
        ]
        if reach >= len(path):
            parts.append((self._group(None, wanted, len(path) <= guaranteed), path[-1]))

        def ranked() -> list[Ranked]:
            if len(parts) == 1:
                group, own = parts[0]
                return [entry for entry in group.ranked(request) if entry[3] is not own]
            entries = [
                entry
                for group, own in parts
                for entry in group.ranked(request)
                if entry[3] is not own
            ]
            entries.sort(key=_ORDER)
            return entries

        return ranked

    def _group(self, top: QueueState | None, wanted: tuple[int, ...], guarantee: bool) -> _Givers:
        """The leaves below `top` (None: every leaf) as givers of `wanted`."""
        key = (None if top is None else top.name, wanted, guarantee)
        group = self._groups.get(key)
        if group is None:
            members = []
            for position, leaf in enumerate(self.session.queues.values()):
                if not leaf.leaf:
                    continue
                if top is None:
                    members.append((position, leaf, leaf.path))
                elif top in leaf.path:
                    members.append((position, leaf, leaf.path[: leaf.path.index(top)]))
            group = self._groups[key] = _Givers(members, wanted, guarantee, self._name_key)
        return group

    def _note_priority(self, unit: Unit, giver: Ranked, after: list[Ranked]) -> None:
        """When queue priority decided that `giver` gives before a queue of its tier that
        holds victims and is further over its fair share, tell the victim search which
        two queues' priorities decided."""
        tier, priorities, *rest = giver[0]
        for other in after:
            other_tier, other_priorities, *other_rest = other[0]
            if other_tier != tier:
                break
            if other_priorities > priorities and other_rest < rest:
                levels = _deciding_levels(giver, other)
                if levels is not None and self.victims.holds_victims(other[2]):
                    self.victims.note_lower_priority(unit, *levels)
                    return

    def _targets(self, ws: WorkloadState, givers: set[str]) -> list[int | None]:
        """Nodes the workload may use where preemptible work of the queues in `givers`
        runs, by the GPUs free or held by that work there, most first (then by name)."""
        session = self.session
        targets = []
        by_node = session.by_node
        if not by_node:
            # Nothing ran as the cycle began (a cluster filling up from empty): no node
            # holds any, and looking at every node would find nothing.
            return []
        for node in session.placer.nodes_of(session.placer.allowed_for(ws)):
            name = node.name
            held = 0.0
            for other in by_node.get(name, ()):
                if other.workload.preemptible and other.queue.name in givers:
                    for placement in other.running.values():
                        if placement.node == name:
                            held += placement.gpu
            if held > EPSILON:
                targets.append((-(node.free_gpu + held), node.index))
        return [index for _, index in sorted(targets)]

    def _name_key(self, queue: QueueState) -> tuple[object, ...]:
        key = self._name_keys.get(queue.name)
        if key is None:
            key = self._name_keys[queue.name] = natural_key(queue.name)
        return key


def _deciding_levels(lower: Ranked, higher: Ranked) -> tuple[QueueState, QueueState] | None:
    """The queues of two givers' paths, top-down from where each meets the reclaimer,
    at the first level where their priorities differ (None when one path's priorities
    begin the other's)."""
    paths = []
    for _, _, leaf, branch in (lower, higher):
        path = leaf.path
        paths.append(path[path.index(branch) :: -1])
    for mine, theirs in zip(*paths, strict=False):
        if mine.priority != theirs.priority:
            return mine, theirs
    return None


class _Givers:
    """The leaves below one queue (or every leaf), ranked as givers of some resources to
    the reclaimers that meet them at that queue, by their path below it. A leaf is ranked
    again only when the sum of that path's stamps has changed (stamps only go up), so a
    reclaim that takes from one queue ranks that queue again, not every queue."""

    __slots__ = (
        "_flat",
        "_guarantee",
        "_leaves",
        "_levels",
        "_marks",
        "_name_key",
        "_order",
        "_positions",
        "_priorities",
        "_ranks",
        "_wanted",
    )

    def __init__(
        self,
        members: list[tuple[int, QueueState, list[QueueState]]],
        wanted: tuple[int, ...],
        guarantee: bool,
        name_key: Callable[[QueueState], tuple[object, ...]],
    ) -> None:
        """`members`: each leaf with its place among the queues and its path below the
        queue; `guarantee`: whether queues above their deserved quota at their fair share
        may give too (a tier after those over their fair share)."""
        self._positions = [position for position, _, _ in members]
        self._leaves = [leaf for _, leaf, _ in members]
        self._levels = [levels for _, _, levels in members]
        # Queue priorities do not change in a cycle: each path's, top-down, once.
        self._priorities = [
            tuple(level.priority for level in reversed(levels)) for levels in self._levels
        ]
        self._flat = all(len(levels) == 1 for levels in self._levels)
        self._wanted = wanted
        self._guarantee = guarantee
        self._name_key = name_key
        # The sum of each path's stamps when it was last ranked (none yet: -1).
        self._marks = [-1] * len(members)
        self._ranks: list[Ranked | None] = [None] * len(members)
        self._order: list[Ranked] = []

    def ranked(self, request: Request) -> list[Ranked]:
        """The leaves that may give now, in rank order; `request` asks for the resources
        of the group (only which it asks for matters)."""
        if self._flat:
            marks = list(map(_STAMP, self._leaves))
        else:
            marks = [sum(map(_STAMP, levels)) for levels in self._levels]
        if marks != self._marks:
            ranks, order = self._ranks, self._order
            # A reclaim changes the totals of a queue or two between calls: those move in
            # the order (entries never compare equal up to their leaf: their places
            # differ), and the others stay where they are.
            for index in compress(range(len(marks)), map(ne, marks, self._marks)):
                before = ranks[index]
                if before is not None:
                    del order[bisect_left(order, before)]
                leaf, levels = self._leaves[index], self._levels[index]
                rank = self._rank(leaf, levels, self._priorities[index], request)
                if rank is None:
                    ranks[index] = None
                else:
                    entry = ranks[index] = (rank, self._positions[index], leaf, levels[-1])
                    insort(order, entry)
            self._marks = marks
        return self._order

    def _rank(
        self,
        leaf: QueueState,
        levels: list[QueueState],
        priorities: tuple[int, ...],
        request: Request,
    ) -> GiverRank | None:
        """The leaf's rank as a giver, or None when it may not give."""
        wanted = self._wanted
        tier = 0 if all_over(levels, wanted) else 1
        if tier == 1 and not (self._guarantee and all_above_deserved(levels, wanted)):
            return None
        return (
            tier,
            priorities,
            -served_ratio(leaf, request),
            -leaf.alloc[GPU],
            self._name_key(leaf),
        )
