"""When a scheduling cycle cannot change anything, so that it may be skipped (the
simulator does).

A cycle binds or evicts only for pending work. Each action needs some pending workload
that, if non-preemptible, stays within its queues' deserved quotas, and:
- any action places a workload that stays within its queues' limits and fits as things
  are: that needs no more GPUs than are free in the whole cluster;
- reclaim: stays within its queues' limits and its queue's fair share while another
  queue is above its own;
- preempt: has a higher priority than some preemptible work running in its queue (whose
  eviction frees room under the queue's limit too).
These are necessary conditions, checked on per-queue totals (the smallest request and
highest priority pending in each queue), so a skipped cycle is one the engine would have
run without deciding anything. Each condition is the engine's own cheap check (the
actions' `could_...` and `engine.quota`'s), and fair shares are divided as the engine
divides them, with its `divide_tree` (and, with time-decayed fair share, the weights of
its `decayed_weights` from the usage the simulator gives the cycle: `set_usage`).

After a cycle that changed nothing, the cluster is settled: until capacity is freed,
the pending work that was there cannot be placed or preempt (the state it failed on is
unchanged), so only new arrivals count for those actions. Reclaim is always checked
against all pending work, since arrivals move fair shares.

`select` says which pending workloads a cycle must see; showing the engine fewer keeps
a long backlog from costing every cycle. It hides work only where the decisions cannot
differ (queues all at the top level, CPU and memory unmanaged):
- a queue whose every pending workload is over its GPU limit, which cannot preempt and
  is within its fair share (so no reclaim frees room under its limit) shows only its
  first workload in queue order (priority, then age). The engine tries the others after
  it, each failing without changing anything, and the first alone keeps the queue's
  fair-share claim the same (demand at or above the limit);
- when the cycle only allocates, and either a single queue has pending work or every
  queue's limit is at most its deserved quota (as under `static`: allotments then equal
  deserved quotas and the fairness order does not depend on demand), each queue shows
  its first workloads that ask for no more than its room (under its limit; a lone
  queue: also in what is free). Room only shrinks in such a cycle, so the larger ones
  cannot fit. The rest of a queue's hidden work is tried after all it shows and nothing
  else changes its allocation, so the decision holds if afterwards the queue cannot fit
  its smallest pending request under its limit (a lone queue: nor in what is left
  free). Otherwise the cycle is run again with all pending work.

The engine still weighs the task shapes of hidden work when it places the rest
(`Snapshot.hidden`), so hiding changes no placement.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TypeVar

from sortedcontainers import SortedList

from corral.engine import divide_tree
from corral.engine.actions import Allocate, Preempt, Reclaim
from corral.engine.fairshare import decayed_weights
from corral.engine.quota import (
    above_deserved_at_share,
    could_stay_within_deserved,
    could_stay_within_limit,
    over_fair_share,
)
from corral.model import Node, Queue, Snapshot
from corral.model.usage import decay_settings

Amounts = tuple[float, float, float]
# What the gate needs to know of a pending workload: GPUs, priority, preemptible.
Shape = tuple[float, int, bool]
# A pending workload's place in its queue: higher priority first, then older, then name.
Order = tuple[int, float, str]

_Key = TypeVar("_Key")

# Pending workloads shown beyond those that would fill a queue's room, in case some of
# those do not fit.
_SPARE = 8

# Slack for rounding, always in the direction of running the cycle.
_SLACK = 1e-6
# A pending workload's name in its queue's `waiting` entries.
_NAME = itemgetter(2)


class _QueueTotals:
    __slots__ = (
        "alloc",
        "children",
        "deserved",
        "fresh",
        "leaf",
        "limit",
        "name",
        "np_alloc",
        "odd",
        "parent",
        "path",
        "pending",
        "priority",
        "requested",
        "running_priorities",
        "waiting",
        "weight",
    )

    def __init__(self, queue: Queue) -> None:
        self.name = queue.name
        self.parent = queue.parent
        self.deserved = (queue.deserved.gpu, queue.deserved.cpu, queue.deserved.memory)
        self.limit = (queue.limit.gpu, queue.limit.cpu, queue.limit.memory)
        self.weight = (
            queue.over_quota_weight.gpu,
            queue.over_quota_weight.cpu,
            queue.over_quota_weight.memory,
        )
        self.priority = queue.priority
        self.children: list[_QueueTotals] = []
        self.path: list[_QueueTotals] = []
        self.leaf = True
        self.alloc = [0.0, 0.0, 0.0]
        self.np_alloc = 0.0
        self.requested = [0.0, 0.0, 0.0]
        self.pending: Counter[Shape] = Counter()
        # Pending work that arrived since the cluster settled.
        self.fresh: Counter[Shape] = Counter()
        self.running_priorities: Counter[int] = Counter()
        # Pending workloads in queue order: (-priority, submitted, name, GPUs).
        self.waiting = SortedList()
        # Pending workloads that are not `plain` (see CycleGate.arrived).
        self.odd = 0


@dataclass(frozen=True, slots=True)
class Selection:
    """The pending workloads a cycle must see. `hidden` counts those left out. `checks`
    lists the queues whose hidden work must be shown not to fit after the cycle, with the
    smallest GPU request among their pending work; `lone` marks a single queue with
    pending work, whose hidden work also fails when less is free than it needs. In a
    cycle that may evict (`evicting`), the decision holds only if it evicted nothing, and
    `share_room` is the lone queue's room under its fair share that its hidden work must
    not fit in (None: no other queue may give to it, so it cannot reclaim)."""

    names: tuple[str, ...]
    hidden: int
    checks: tuple[tuple[str, float], ...]
    lone: bool
    evicting: bool = False
    share_room: float | None = None


class CycleGate:
    """Running totals of the cluster's queues, kept by the simulator as work arrives,
    starts, stops and is evicted; `may_change` says whether a cycle is worth running."""

    def __init__(self, nodes: Sequence[Node], queues: Sequence[Queue], actions: Iterable[str]):
        self.actions = frozenset(actions)
        self.queues = {queue.name: _QueueTotals(queue) for queue in queues}
        self.roots: list[_QueueTotals] = []
        for totals in self.queues.values():
            if totals.parent is None:
                self.roots.append(totals)
            else:
                parent = self.queues[totals.parent]
                parent.children.append(totals)
                parent.leaf = False
        for totals in self.queues.values():
            level: _QueueTotals | None = totals
            while level is not None:
                totals.path.append(level)
                level = self.queues[level.parent] if level.parent else None
        usable = [node for node in nodes if node.schedulable]
        self.capacity = [
            float(sum(node.gpus for node in usable)),
            float(sum(node.cpu for node in usable)),
            float(sum(node.memory for node in usable)),
        ]
        self.free_gpu = self.capacity[0]
        # Hiding pending work is exact only for a flat queue tree without CPU or memory quotas.
        self.trimmable = all(queue.parent is None for queue in queues) and all(
            math.isinf(amount)
            for queue in queues
            for amount in (
                queue.deserved.cpu,
                queue.deserved.memory,
                queue.limit.cpu,
                queue.limit.memory,
            )
        )
        # Reservations depend on which pending work the engine sees.
        self.reserving = any(queue.reserve_after is not None for queue in queues)
        self.pending_count = 0
        self.settled = False
        self.freed = False
        # Time-decayed fair share: usage factors of the queues where it is on, and the
        # GPU weights of the latest usage.
        self.factors = {name: setting.k for name, setting in decay_settings(queues).items()}
        self.gpu_weights: dict[str, float] = {}
        # The fair shares as the totals stand, until they change.
        self._shares: dict[str, list[float]] | None = None

    @classmethod
    def of(cls, snapshot: Snapshot, actions: Iterable[str]) -> CycleGate:
        """The gate of `snapshot` as it stands, unsettled (every pending workload counts),
        as the simulator's reports would have made it. Its answers hold for snapshots like
        the simulator's: whole workloads (none elastic), every node schedulable, one pool,
        nothing hidden."""
        gate = cls(snapshot.nodes, snapshot.queues, actions)
        for workload in snapshot.workloads:
            groups = workload.task_groups
            gpus = sum(group.gpu * group.replicas for group in groups)
            cpu = sum(group.cpu * group.replicas for group in groups)
            memory = float(sum(group.memory * group.replicas for group in groups))
            shape = (gpus, workload.priority, workload.preemptible)
            order = (-workload.priority, workload.submitted, workload.name)
            plain = len(groups) == 1 and cpu == 0 and memory == 0
            gate.arrived(workload.queue, shape, (gpus, cpu, memory), order, plain)
            if workload.placements:
                placed = (sum(p.gpu for p in workload.placements), cpu, memory)
                gate.started(workload.queue, shape, (gpus, cpu, memory), placed, order, plain)
        return gate

    # -- what the simulator reports ---------------------------------------------------

    def arrived(
        self, queue: str, shape: Shape, request: Amounts, order: Order, plain: bool
    ) -> None:
        """A workload became pending: it was submitted, or evicted (`fresh` either way).
        `plain`: its tasks are alike (one task group) and ask for no CPU or memory, so
        that whether it fits only gets less likely as the cluster fills, and hiding it
        changes no CPU or memory total."""
        totals = self.queues[queue]
        totals.odd += not plain
        totals.waiting.add((*order, shape[0]))
        totals.pending[shape] += 1
        totals.fresh[shape] += 1
        self.pending_count += 1
        self._request(totals, request, 1.0)

    def started(
        self,
        queue: str,
        shape: Shape,
        request: Amounts,
        placed: Amounts,
        order: Order,
        plain: bool,
    ) -> None:
        """A pending workload started with `placed` amounts (its request as placed)."""
        totals = self.queues[queue]
        totals.odd -= not plain
        totals.waiting.remove((*order, shape[0]))
        # `fresh` is cleared by the cycle_done that follows every cycle that starts work.
        _drop(totals.pending, shape)
        self.pending_count -= 1
        self._request(totals, request, -1.0)
        self._run(totals, shape, placed, 1.0)

    def stopped(self, queue: str, shape: Shape, placed: Amounts) -> None:
        """A running workload ended or was evicted; its capacity is free."""
        self._run(self.queues[queue], shape, placed, -1.0)
        self.freed = True

    def set_usage(self, usage: Mapping[str, float]) -> None:
        """The queues' usage shares the next cycle is given (time-decayed fair share)."""
        if self.factors:
            self.gpu_weights = decayed_weights(self.roots, usage, self.factors)
            self._shares = None

    def cycle_done(self, changed: bool) -> None:
        """After a cycle: one that changed nothing leaves the cluster settled."""
        self.settled = not changed
        self.freed = False
        for totals in self.queues.values():
            totals.fresh.clear()

    def _request(self, totals: _QueueTotals, amounts: Amounts, sign: float) -> None:
        self._shares = None
        for level in totals.path:
            for resource in range(3):
                level.requested[resource] += sign * amounts[resource]

    def _run(self, totals: _QueueTotals, shape: Shape, placed: Amounts, sign: float) -> None:
        _, priority, preemptible = shape
        self._shares = None
        for level in totals.path:
            for resource in range(3):
                level.alloc[resource] += sign * placed[resource]
                level.requested[resource] += sign * placed[resource]
            if not preemptible:
                level.np_alloc += sign * placed[0]
        if preemptible:
            if sign > 0:
                totals.running_priorities[priority] += 1
            else:
                _drop(totals.running_priorities, priority)
        self.free_gpu -= sign * placed[0]

    # -- the question ------------------------------------------------------------------

    def may_change(self) -> bool:
        """False only when no action of a cycle could bind or evict anything."""
        if self.pending_count == 0:
            return False
        # Every action places a workload that fits without evicting anything.
        places = bool(self.actions)
        preempts = "preempt" in self.actions
        only_fresh = self.settled and not self.freed
        for totals in self.queues.values():
            if not totals.pending:
                continue
            headroom, np_headroom = _headrooms(totals)
            lowest_running = min(totals.running_priorities, default=math.inf)
            for gpus, priority, preemptible in totals.fresh if only_fresh else totals.pending:
                if not could_stay_within_deserved(gpus, preemptible, np_headroom, _SLACK):
                    continue
                # Preemption evicts work of the same queue, which frees room under its limit.
                if preempts and Preempt.could_preempt(priority, lowest_running):
                    return True
                if places and Allocate.could_place(gpus, headroom, self.free_gpu, _SLACK):
                    return True
        return "reclaim" in self.actions and self._may_reclaim()

    def select(self, first: int) -> Selection:
        """The pending workloads the next cycle must see (see the module's description);
        `first` is the most a queue shows when the decision is checked afterwards."""
        names: list[str] = []
        hidden = 0
        checks: list[tuple[str, float]] = []
        allocating = self.actions == {"allocate"}
        queued = [totals for totals in self.queues.values() if totals.waiting]
        if not allocating and len(queued) == 1:
            trimmed = self._select_lone(queued[0], first)
            if trimmed is not None:
                return trimmed
        lone = allocating and len(queued) == 1
        # Allocation alone, and every allotment equal to deserved (no limit above it): the
        # fairness order does not depend on demand, and a queue's hidden work comes after
        # all it shows.
        owned = (
            allocating
            and self.trimmable
            and all(
                totals.limit[0] <= totals.deserved[0] + _SLACK for totals in self.queues.values()
            )
        )
        trims = self.trimmable and not (lone or owned)
        for totals in self.queues.values():
            waiting = totals.waiting
            if not waiting:
                continue
            if lone or owned:
                shown, complete = self._enough(totals, lone, first)
                if not complete:
                    checks.append((totals.name, min(gpus for gpus, _, _ in totals.pending)))
                names.extend(shown)
                hidden += len(waiting) - len(shown)
                continue
            count = len(waiting)
            if trims and self._blocked(totals):
                count = 1
            names.extend(map(_NAME, waiting if count == len(waiting) else waiting.islice(0, count)))
            hidden += len(waiting) - count
        return Selection(tuple(names), hidden, tuple(checks), lone)

    def _select_lone(self, totals: _QueueTotals, most: int) -> Selection | None:
        """For a cycle that may evict, with one queue's work pending: its first workloads,
        as `_enough` picks them for a lone queue, when the rest cannot change the decision
        (None: show it all). The engine tries the hidden ones after all that is shown (no
        other queue has pending work, and simulated jobs are never elastic), and each
        fails without changing anything if, in that order:
        - the cycle evicts nothing (checked afterwards; moves count): the cluster then
          only fills, the queue's work is placed only by allocate (plain work that does
          not fit does not fit a fuller cluster either), and less is free when a hidden
          workload is tried than it asks for (checked afterwards, as for allocation);
        - it cannot preempt: nothing of its queue runs at a lower priority;
        - it cannot reclaim: its queue would exceed its fair share with it (checked
          afterwards, with what the cycle placed), or no other queue holds its fair share
          or more, so none may give (nothing else changes their totals);
        - it is plain, so hiding it changes no CPU or memory total.
        Hiding lowers the demand of its queue alone: that queue's fair share may fall, the
        others' only rise. No queue that holds less than its fair share as things are
        holds more in the cycle; a shown workload that would reclaim with the full share
        fits the room under it, which the check afterwards catches, and the cycle runs
        again whole."""
        if not self.trimmable or self.reserving or totals.odd:
            return None
        if "preempt" in self.actions:
            lowest_running = min(totals.running_priorities, default=math.inf)
            highest = max(priority for _, priority, _ in totals.pending)
            if Preempt.could_preempt(highest, lowest_running):
                return None
        shown, complete = self._enough(totals, True, most)
        if complete:
            return None
        shares = self._fair_shares()
        gave = [
            other
            for other in self.queues.values()
            if other.leaf
            and other is not totals
            and other.alloc[0] > shares[other.name][0] - _SLACK
        ]
        share_room = shares[totals.name][0] - totals.alloc[0] if gave else None
        smallest = min(gpus for gpus, _, _ in totals.pending)
        return Selection(
            tuple(shown),
            len(totals.waiting) - len(shown),
            ((totals.name, smallest),),
            lone=True,
            evicting=True,
            share_room=share_room,
        )

    def _enough(self, totals: _QueueTotals, lone: bool, most: int) -> tuple[list[str], bool]:
        """A queue's first pending workloads that could fit: enough to ask for all the room
        it has (under its limit, and for a lone queue in the cluster), and a few more in
        case some do not fit, but at most `most`. Workloads asking for more than the room
        are left out: when the cycle only allocates, room only shrinks, so they cannot
        fit. True with them when every workload left out is such a one."""
        room = totals.limit[0] - totals.alloc[0]
        if lone:
            room = min(room, self.free_gpu)
        asked = 0.0
        shown: list[str] = []
        spare = _SPARE
        for entry in totals.waiting:
            gpus = entry[3]
            if gpus > room + _SLACK:
                continue
            if len(shown) == most or (asked > room + _SLACK and spare == 0):
                return shown, False
            if asked > room + _SLACK:
                spare -= 1
            asked += gpus
            shown.append(entry[2])
        return shown, True

    def holds(self, selection: Selection, placed: Mapping[str, float], evicted: bool) -> bool:
        """Whether a decision on `selection` is the decision on all pending work: after
        placing `placed` GPUs per queue, no queue can fit its smallest hidden request
        under its limit (or, for a lone queue, in what is left free); in a cycle that
        may evict, nothing was `evicted` and the lone queue's hidden work cannot fit
        under its fair share (see `_select_lone`)."""
        if selection.evicting:
            if evicted:
                return False
            name, smallest = selection.checks[0]
            room = selection.share_room
            if room is not None and placed.get(name, 0.0) + smallest <= room + _SLACK:
                return False
        free = self.free_gpu - sum(placed.values())
        for name, smallest in selection.checks:
            totals = self.queues[name]
            alloc = totals.alloc[0] + placed.get(name, 0.0)
            if alloc + smallest > totals.limit[0] + _SLACK:
                continue
            if selection.lone and smallest > free + _SLACK:
                continue
            return False
        return True

    def _blocked(self, totals: _QueueTotals) -> bool:
        """Every pending workload of the queue is over its GPU limit, none can preempt, and
        no other queue may reclaim from it (which would free room under its limit)."""
        headroom = totals.limit[0] - totals.alloc[0]
        if could_stay_within_limit(min(gpus for gpus, _, _ in totals.pending), headroom, _SLACK):
            return False
        if totals.alloc[0] > self._fair_shares()[totals.name][0] + _SLACK:
            return False
        if "preempt" not in self.actions:
            return True
        lowest_running = min(totals.running_priorities, default=math.inf)
        highest = max(priority for _, priority, _ in totals.pending)
        return not Preempt.could_preempt(highest, lowest_running)

    def _may_reclaim(self) -> bool:
        shares = self._fair_shares()
        over = [
            totals
            for totals in self.queues.values()
            if totals.leaf
            and (
                over_fair_share(totals.alloc, shares[totals.name], slack=_SLACK)
                # A queue under its deserved quota may take from one above its own.
                or above_deserved_at_share(totals.alloc, totals.deserved, shares[totals.name])
            )
        ]
        if not over:
            return False
        for totals in self.queues.values():
            if not totals.pending or (len(over) == 1 and over[0] is totals):
                continue
            headroom, np_headroom = _headrooms(totals)
            share = shares[totals.name][0]
            for gpus, _, preemptible in totals.pending:
                if not (
                    could_stay_within_limit(gpus, headroom, _SLACK)
                    and could_stay_within_deserved(gpus, preemptible, np_headroom, _SLACK)
                ):
                    continue
                if Reclaim.could_take(gpus, totals.alloc[0], share, _SLACK):
                    return True
        return False

    def _fair_shares(self) -> dict[str, list[float]]:
        """Each queue's fair share of GPU, CPU and memory, divided as the engine does."""
        if self._shares is None:
            self._shares = divide_tree(self.roots, self.capacity, self.gpu_weights)
        return self._shares


def _headrooms(totals: _QueueTotals) -> tuple[float, float]:
    """The least GPU room under the limits of the queue and its ancestors, and under
    their deserved quotas for non-preemptible work."""
    if len(totals.path) == 1:
        # A queue at the top (the common case): no generators.
        return totals.limit[0] - totals.alloc[0], totals.deserved[0] - totals.np_alloc
    return (
        min(level.limit[0] - level.alloc[0] for level in totals.path),
        min(level.deserved[0] - level.np_alloc for level in totals.path),
    )


def _drop(counter: Counter[_Key], key: _Key) -> None:
    if counter[key] <= 1:
        del counter[key]
    else:
        counter[key] -= 1
