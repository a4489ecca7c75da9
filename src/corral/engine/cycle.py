"""One scheduling cycle: allocate, consolidate, reclaim, preempt.

`schedule(snapshot, config)` is pure and deterministic: the same input always gives the
same decisions. Every action works on one tentative ClusterState; an attempt that evicts
or moves work is simulated first and committed only when the workload it is for really
fits, otherwise it is rolled back.
"""

from __future__ import annotations

import itertools
import math
import operator
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from corral.engine.fairshare import divide_tree
from corral.engine.fragmentation import Fragmentation, shapes_of, task_shapes
from corral.engine.ordering import Candidate, FairOrder, Request
from corral.engine.placement import Allowed, Failure, Placer
from corral.engine.state import (
    ClusterState,
    QueueState,
    WorkloadState,
    amounts_fit,
    as_resources,
    natural_key,
)
from corral.model import (
    Decisions,
    Eviction,
    Placement,
    QueueCycle,
    QueueStatus,
    SchedulerConfig,
    Snapshot,
    UnknownParent,
    Workload,
    check_tree,
)
from corral.model.resources import EPSILON, format_gpus, format_memory, plural_gpus

_SUBMITTED = operator.attrgetter("submitted", "name")

# A victim: some running tasks of one workload, evicted together. `tasks` None means
# every task still running (a whole workload, or the minimum gang of an elastic one).
Unit = tuple[WorkloadState, tuple[int, ...] | None]


def schedule(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Decisions:
    """Run one scheduling cycle over `snapshot` and return what it decided."""
    return Cycle(snapshot, config or SchedulerConfig()).run()


def apply_decisions(snapshot: Snapshot, decisions: Decisions) -> Snapshot:
    """The snapshot after `decisions`: evictions first, then bindings."""
    evicted: dict[str, set[int]] = {}
    for eviction in decisions.evictions:
        evicted.setdefault(eviction.workload, set()).update(eviction.tasks)
    workloads: list[Workload] = []
    for workload in snapshot.workloads:
        gone = evicted.get(workload.name, set())
        started = decisions.bindings.get(workload.name, ())
        if not gone and not started:
            workloads.append(workload)
            continue
        placements = [p for p in workload.placements if p.task not in gone]
        placements.extend(started)
        placements.sort(key=lambda p: p.task)
        workloads.append(replace(workload, placements=tuple(placements)))
    return Snapshot(snapshot.nodes, snapshot.queues, tuple(workloads), snapshot.hidden)


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
        with self._lock:
            # A cycle that fails leaves nothing kept: the next one starts afresh.
            kept, self._kept = self._kept, None
            cycle = Cycle(snapshot, config or SchedulerConfig(), kept)
            decisions = cycle.run()
            self._kept = Kept(snapshot, cycle)
            return decisions


class Kept:
    """The state a cycle ended with, for the next cycle of a Scheduler."""

    def __init__(self, snapshot: Snapshot, cycle: Cycle) -> None:
        self.nodes = snapshot.nodes
        self.queue_specs = snapshot.queues
        self.queues: dict[str, QueueState] = cycle.queues
        self.state: ClusterState = cycle.state
        self.workloads = {ws.name: ws for ws in cycle.workloads}

    def holds(self, snapshot: Snapshot) -> bool:
        """Whether the kept state is of the same nodes and queues."""
        return (self.nodes is snapshot.nodes or self.nodes == snapshot.nodes) and (
            self.queue_specs is snapshot.queues or self.queue_specs == snapshot.queues
        )


def _runs_as(ws: WorkloadState, workload: Workload) -> bool:
    """Whether `workload` has the same tasks, in the same queue, running where `ws` has."""
    old = ws.workload
    if old is not workload and (
        old.queue != workload.queue
        or old.task_groups != workload.task_groups
        or old.preemptible != workload.preemptible
        or old.node_selector != workload.node_selector
    ):
        return False
    running = ws.running
    if len(running) != len(workload.placements):
        return False
    for placement in workload.placements:
        now = running.get(placement.task)
        if now is not placement and now != placement:
            return False
    return True


class Cycle:
    """The state of one cycle and its four actions."""

    def __init__(
        self, snapshot: Snapshot, config: SchedulerConfig, kept: Kept | None = None
    ) -> None:
        self.config = config
        previous: dict[str, WorkloadState] = {}
        fresh = kept is None or not kept.holds(snapshot)
        if kept is not None and not fresh:
            self.queues = kept.queues
            for kept_queue in self.queues.values():
                kept_queue.requested[:] = (0.0, 0.0, 0.0)
                kept_queue.set_fair_share([0.0, 0.0, 0.0])
            self.state = kept.state
            previous = kept.workloads
        else:
            self.queues = _build_queues(snapshot)
            self.state = ClusterState(snapshot.nodes, self.queues)
        max_memory = max((node.gpu_memory for node in snapshot.nodes if node.gpus), default=0)
        self.workloads: list[WorkloadState] = []
        # Workloads with no task running as the cycle began.
        self.waiting: list[WorkloadState] = []
        self._by_node: dict[str, list[WorkloadState]] | None = None
        state = self.state
        # Kept work changes with the indices kept up to date; fresh work loads without.
        load = state.load if fresh else state.add
        names: set[str] = set()
        for workload in sorted(snapshot.workloads, key=_SUBMITTED):
            name = workload.name
            queue = self.queues.get(workload.queue)
            if queue is None or not queue.leaf:
                raise ValueError(f"workload {name}: {workload.queue!r} is not a leaf queue")
            if name in names:
                raise ValueError(f"workload {name}: listed twice")
            names.add(name)
            ws = previous.pop(name, None)
            if (
                ws is not None
                and ws.workload is workload
                and not ws.started
                and len(ws.running) == len(ws.original) < 2
            ):
                # Given as last time, and the last cycle left it as it was (with one task
                # or none, so in the same order too).
                ws.reason = None
            elif ws is not None and _runs_as(ws, workload):
                if ws.workload is not workload:
                    ws.workload = workload
                    ws.gang = None
                    ws.sized = False
                if ws.started or len(ws.running) != len(ws.original):
                    ws.demand = None
                if len(ws.running) > 1:
                    # In the snapshot's order, as if loaded afresh.
                    ws.running = {p.task: ws.running[p.task] for p in workload.placements}
                ws.started = {}
                ws.reason = None
                ws.original = dict(ws.running)
            else:
                if ws is not None:
                    state.remove(ws)
                ws = WorkloadState(workload, queue, workload.tasks())
                ws.shapes = task_shapes(workload, max_memory)
                for placement in workload.placements:
                    if placement.node not in state.by_name:
                        raise ValueError(f"workload {name}: unknown node {placement.node!r}")
                    load(ws, placement)
                ws.original = dict(ws.running)
            self.workloads.append(ws)
            if not ws.running:
                self.waiting.append(ws)
        for gone in previous.values():
            state.remove(gone)
        previous.clear()
        shapes = shapes_of(snapshot.hidden, max_memory)
        for ws in self.workloads:
            for shape, tasks in ws.shapes or ():
                shapes[shape] += tasks
        fragmentation = Fragmentation(snapshot.nodes, shapes)
        state.journal.clear()
        if state.set_kinds(fragmentation.kind_of) or fresh:
            state.index()
        else:
            state.settle()
        self.placer = Placer(state, config, fragmentation)
        self._compute_fair_shares()
        self.evictions: list[Eviction] = []
        # Workloads evicted or moved this cycle are not victims again in the same cycle.
        self.touched: set[str] = set()
        self._units: dict[str, list[Unit]] | None = None
        # Victim lists are consumed front first: where each queue's untouched units start.
        self._cursor: dict[str, int] = {}
        self._tentative: set[int] = set()
        # Within one eviction attempt, where each queue's search for victims resumes:
        # units passed over stay unusable until the attempt ends.
        self._resume: dict[str, int] = {}
        self._name_keys: dict[str, tuple[object, ...]] = {}
        # True from the end of allocate until work is evicted or moved: meanwhile the
        # state has only filled up, so pending work that did not fit still does not.
        self._settled = False

    def run(self) -> Decisions:
        """Run the configured actions in order and return the decisions."""
        actions: dict[str, Callable[[], None]] = {
            "allocate": self.allocate,
            "consolidate": self.consolidate,
            "reclaim": self.reclaim,
            "preempt": self.preempt,
        }
        for action in self.config.actions:
            if action not in actions:
                raise ValueError(f"unknown action {action!r}; expected one of {', '.join(actions)}")
            actions[action]()
        return self.decisions()

    # -- fair share --------------------------------------------------------------------

    def _compute_fair_shares(self) -> None:
        for ws in self.workloads:
            request = ws.demand
            if request is None:
                request = ws.demand = self.request_of(ws, range(len(ws.tasks)))
            for queue in ws.queue.path:
                for resource in range(3):
                    queue.requested[resource] += request[resource]
        capacity = [0.0, 0.0, 0.0]
        for node in self.state.nodes:
            if node.node.schedulable:
                capacity[0] += node.node.gpus
                capacity[1] += node.node.cpu
                capacity[2] += node.node.memory
        roots = [queue for queue in self.queues.values() if queue.parent is None]
        for name, share in divide_tree(roots, capacity).items():
            self.queues[name].set_fair_share(share)

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

    # -- quota rules -------------------------------------------------------------------

    def quota_block(self, ws: WorkloadState, request: Request) -> str | None:
        """Why `request` may not be added to the workload's queues, or None if it may."""
        return limit_block(ws, request) or deserved_block(ws, request)

    # -- allocate ----------------------------------------------------------------------

    def allocate(self) -> None:
        """Place pending workloads and grow elastic ones, in fairness order."""
        order = FairOrder(list(self.queues.values()))
        for ws in self.workloads:
            if not ws.running:
                order.add(self._gang_candidate(ws))
            elif len(ws.running) < len(ws.tasks) and ws.workload.elastic:
                order.add(self._growth_candidate(ws))
        order.refresh_all(list(self.queues.values()))
        while (candidate := order.pop()) is not None:
            ws = candidate.workload
            if self._try_place(candidate) and ws.workload.elastic and ws.unplaced():
                order.add(self._growth_candidate(ws))
            order.refresh(ws.queue)
        self._settled = True

    def _gang_candidate(self, ws: WorkloadState) -> Candidate:
        # Only asked for workloads with no task running, so the request is nominal (and
        # stays the same while the state is kept, on the same nodes).
        candidate = ws.gang
        if candidate is None:
            tasks = list(range(ws.workload.min_tasks))
            candidate = ws.gang = Candidate(ws, tasks, self.request_of(ws, tasks), growth=False)
        return candidate

    def _growth_candidate(self, ws: WorkloadState) -> Candidate:
        tasks = ws.unplaced()[:1]
        return Candidate(ws, tasks, self.request_of(ws, tasks), growth=True)

    def _try_place(self, candidate: Candidate) -> bool:
        ws = candidate.workload
        reason = self.quota_block(ws, candidate.request)
        if reason is None and not candidate.growth:
            if not ws.sized:
                # The minimum gang and the nodes stay the same while the state is kept.
                ws.never_fits = self.placer.too_big(ws, candidate.tasks)
                ws.sized = True
            reason = ws.never_fits
        if reason is None and candidate.request[0] > self.state.free_gpu + EPSILON:
            reason = (
                f"needs {plural_gpus(candidate.request[0])}; the cluster has "
                f"{plural_gpus(max(self.state.free_gpu, 0.0))} free"
            )
        if reason is None:
            result = self._place_checked(ws, candidate.tasks)
            if not isinstance(result, str):
                self.state.journal.clear()
                return True
            reason = result
        if not candidate.growth:
            ws.reason = reason
        return False

    def _place_checked(self, ws: WorkloadState, tasks: list[int]) -> list[Placement] | str:
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
            exact = (gpu, *self._host_request(ws, tasks))
            state.rollback(mark)
            reason = self.quota_block(ws, exact)
            if reason is not None:
                return reason
            for placement in result:
                state.bind(ws, placement)
        for placement in result:
            ws.started[placement.task] = placement
        return result

    @property
    def by_node(self) -> dict[str, list[WorkloadState]]:
        """The workloads running on each node as the cycle began."""
        if self._by_node is None:
            self._by_node = {}
            for ws in self.workloads:
                for node in dict.fromkeys(placement.node for placement in ws.original.values()):
                    self._by_node.setdefault(node, []).append(ws)
        return self._by_node

    @staticmethod
    def _host_request(ws: WorkloadState, tasks: list[int]) -> tuple[float, float]:
        return (
            sum(ws.tasks[task].cpu for task in tasks),
            float(sum(ws.tasks[task].memory for task in tasks)),
        )

    # -- consolidate -------------------------------------------------------------------

    def consolidate(self) -> None:
        """Move preemptible workloads between nodes when that lets a pending one fit.

        Every moved workload must be placed again in the same cycle: no net eviction.
        """
        # Moves keep the queues' totals and the free GPUs as they are, and a placement only
        # adds to them, so work that cannot be helped now cannot be later in this action.
        if not any(self._may_consolidate(candidate) for candidate in self._pending()):
            return
        for candidate in self._pending_in_order():
            if self._may_consolidate(candidate):
                ws = candidate.workload
                self._consolidate_for(ws, candidate.tasks, self.placer.eligible(ws))

    def _may_consolidate(self, candidate: Candidate) -> bool:
        ws = candidate.workload
        # Moves keep every workload placed, so only capacity free somewhere can help; it
        # may sit on nodes the candidate cannot use, where moved work can go.
        return (
            ws.workload.topology is None
            and self.quota_block(ws, candidate.request) is None
            and candidate.request[0] <= self.state.free_gpu + EPSILON
        )

    def _consolidate_for(self, ws: WorkloadState, tasks: list[int], allowed: Allowed) -> bool:
        state = self.state
        mark = state.checkpoint()
        moved: list[WorkloadState] = []
        placed: list[Placement] = []
        for task in tasks:
            placement = self.placer.place_task(ws.tasks[task], task, allowed)
            if placement is None:
                placement = self._make_room(ws, task, allowed, moved)
            if placement is None:
                state.rollback(mark)
                return False
            state.bind(ws, placement)
            placed.append(placement)
        if not self._within_quota(ws):
            # Memory-sized fractions may have taken more of a device than estimated.
            state.rollback(mark)
            return False
        replaced: dict[str, list[Placement]] = {}
        for mover in moved:
            result = self.placer.place(mover, sorted(mover.original))
            # A memory-sized fraction may take a larger share of a smaller device.
            if isinstance(result, Failure) or not self._within_quota(mover):
                state.rollback(mark)
                return False
            replaced[mover.name] = result
        for placement in placed:
            ws.started[placement.task] = placement
        for mover in moved:
            reason = f"moved to another node to make room for {ws.name}"
            self._record_eviction(mover, tuple(sorted(mover.original)), "consolidate", ws, reason)
            for placement in replaced[mover.name]:
                mover.started[placement.task] = placement
        state.journal.clear()
        return True

    def _make_room(
        self, ws: WorkloadState, task: int, allowed: Allowed, moved: list[WorkloadState]
    ) -> Placement | None:
        """Take movable workloads off one node (tentatively) until `task` fits there."""
        state = self.state
        group = ws.tasks[task]
        nodes = [
            node for node in self.placer.nodes_of(allowed) if node.node.gpus >= math.ceil(group.gpu)
        ]
        # Most free capacity first; between equals, the node whose movable work is newest,
        # since the newest work is the first to be disturbed everywhere else too.
        nodes.sort(key=lambda node: (-node.free_gpu, -self._newest_movable(node.name), node.index))
        for node in nodes[: self.config.consolidate_max_nodes]:
            mark = state.checkpoint()
            movers = [
                other
                for other in self.by_node.get(node.name, [])
                if self._movable(other) and other not in moved
            ]
            movers.sort(
                key=lambda other: (
                    self.request_of(other, list(other.running))[0],
                    -other.workload.submitted,
                )
            )
            taken = []
            only_here = frozenset((node.index,))
            for other in movers[: self.config.consolidate_max_moves]:
                for running in list(other.running):
                    state.unbind(other, running)
                taken.append(other)
                placement = self.placer.place_task(group, task, only_here)
                if placement is not None:
                    moved.extend(taken)
                    return placement
            state.rollback(mark)
        return None

    def _newest_movable(self, node: str) -> float:
        ages = [ws.workload.submitted for ws in self.by_node.get(node, []) if self._movable(ws)]
        return max(ages, default=-math.inf)

    def _movable(self, ws: WorkloadState) -> bool:
        return (
            ws.preemptible
            and ws.name not in self.touched
            and not ws.started
            and bool(ws.original)
            and len(ws.running) == len(ws.original)
        )

    # -- reclaim -----------------------------------------------------------------------

    def reclaim(self) -> None:
        """Queues under their fair share take GPUs back from queues above theirs.

        Victims come in queue order (the most over-served queue first, then its own
        order). When those would not make room, as when they free GPUs spread over nodes
        where the candidate needs them together, the same victims are tried node by node,
        the nodes with the most GPUs free or held by queues that may give first."""
        everything = (1.0, 1.0, 1.0)
        if not any(
            queue.leaf and _over_fair_share(queue, everything) for queue in self.queues.values()
        ):
            return
        # Whether another queue is over its fair share changes only when a reclaim is made.
        anyone_over: dict[tuple[str, bool, bool, bool], bool] = {}
        reaches = [
            (candidate, self._reclaim_reach(candidate, anyone_over))
            for candidate in self._pending()
        ]
        if not any(reach for _, reach in reaches):
            # Nothing is reclaimed, so the state stays as it is and the order is moot.
            for candidate, reach in reaches:
                if reach == 0:
                    self._cannot_reclaim_within(candidate)
            return
        for candidate in self._pending_in_order():
            reach = self._reclaim_reach(candidate, anyone_over)
            if reach is None:
                continue
            ws = candidate.workload
            if reach == 0:
                self._cannot_reclaim_within(candidate)
                continue
            placed, tried = self._evict_for(
                candidate, self._reclaim_victims(candidate, reach), "reclaim"
            )
            if not placed and tried and candidate.request[0] > EPSILON:
                # Victims in queue order may free GPUs spread over nodes where the
                # candidate's tasks need them together: try again node by node.
                placed, _ = self._evict_for(
                    candidate, self._reclaim_victims(candidate, reach, by_node=True), "reclaim"
                )
            if placed:
                anyone_over.clear()
            else:
                self._note(
                    ws,
                    "cannot reclaim: evicting work of queues over their fair share would not "
                    "make room"
                    if tried
                    else "cannot reclaim: no queue it may take from holds preemptible work "
                    "over its fair share",
                )

    def _reclaim_reach(
        self, candidate: Candidate, anyone_over: dict[tuple[str, bool, bool, bool], bool]
    ) -> int | None:
        """How far up its queue path the candidate stays within fair share (see
        `_within_fair_share`); None when reclaim does not apply to it."""
        ws = candidate.workload
        request = candidate.request
        if self.quota_block(ws, request) is not None:
            return None
        key = (ws.queue.name, request[0] > EPSILON, request[1] > EPSILON, request[2] > EPSILON)
        anyone = anyone_over.get(key)
        if anyone is None:
            anyone = anyone_over[key] = self._anyone_over_fair_share(ws, request)
        if not anyone:
            return None
        return _within_fair_share(ws.queue, request)

    def _cannot_reclaim_within(self, candidate: Candidate) -> None:
        queue = candidate.workload.queue
        resource = _first_over(queue.alloc, candidate.request, queue.fair_share)
        share = amount_text(resource, queue.fair_share[resource])
        self._note(
            candidate.workload,
            f"cannot reclaim: queue {queue.name} would exceed its fair share of {share}",
        )

    def _anyone_over_fair_share(self, ws: WorkloadState, request: Request) -> bool:
        return any(
            leaf.leaf and leaf is not ws.queue and _over_fair_share(leaf, request)
            for leaf in self.queues.values()
        )

    @staticmethod
    def _note(ws: WorkloadState, note: str) -> None:
        """Add what a later action found to the workload's pending reason."""
        ws.reason = f"{ws.reason}; {note}" if ws.reason else note

    def _reclaim_victims(
        self, candidate: Candidate, reach: int, by_node: bool = False
    ) -> Callable[[], Unit | None]:
        """Victims for a reclaim, one at a time: the first unit of the most over-served
        queue that may give. `by_node`: only units with a task on one node at a time, the
        nodes with the most GPUs free or held by queues that may give first."""
        ws = candidate.workload
        request = candidate.request
        path = ws.queue.path
        ancestors = {queue.name for queue in path}
        # The victim's branch must split from the reclaimer's at an ancestor below which
        # the reclaimer stays within its fair share (the root counts when all of it does).
        meeting = {queue.name for queue in path[1 : reach + 1]}
        root_allowed = reach >= len(path)
        leaves = [leaf for leaf in self.queues.values() if leaf.leaf and leaf is not ws.queue]
        # Whether a leaf may give depends on the totals of its path below the reclaimer's,
        # and its rank on its own: an eviction changes only those of the victim's path.
        below = {
            leaf.name: {
                level.name
                for level in itertools.takewhile(lambda q: q.name not in ancestors, leaf.path)
            }
            for leaf in leaves
        }
        ranked: dict[str, tuple[tuple[float, float, tuple[object, ...]], QueueState]] = {}
        taken_from: list[QueueState] = []

        def rank(leaf: QueueState) -> None:
            if _over_below(leaf, ancestors, meeting, root_allowed, request):
                key = (-_served_ratio(leaf, request), -leaf.alloc[0], self._name_key(leaf))
                ranked[leaf.name] = (key, leaf)
            else:
                ranked.pop(leaf.name, None)

        for leaf in leaves:
            rank(leaf)
        targets: list[int | None] = [None]
        if by_node:
            givers = set(ranked)
            targets = self._reclaim_targets(ws, givers)

        def next_victim() -> Unit | None:
            if taken_from:
                changed = {queue.name for queue in taken_from.pop().path}
                for leaf in leaves:
                    if not below[leaf.name].isdisjoint(changed):
                        rank(leaf)
            while targets:
                for _, leaf in sorted(ranked.values(), key=lambda item: item[0]):
                    unit = self._first_unit(leaf, ws, None, targets[0])
                    if unit is not None:
                        taken_from.append(leaf)
                        return unit
                targets.pop(0)
                # Units passed over for being on another node may be on the next one.
                self._resume.clear()
            return None

        return next_victim

    def _reclaim_targets(self, ws: WorkloadState, givers: set[str]) -> list[int | None]:
        """Nodes the workload may use where preemptible work of the queues in `givers`
        runs, by the GPUs free or held by that work there, most first (then by name)."""
        targets = []
        for node in self.placer.nodes_of(self.placer.eligible(ws)):
            held = sum(
                placement.gpu
                for other in self.by_node.get(node.name, [])
                if other.preemptible and other.queue.name in givers
                for placement in other.running.values()
                if placement.node == node.name
            )
            if held > EPSILON:
                targets.append((-(node.free_gpu + held), node.index))
        return [index for _, index in sorted(targets)]

    def _name_key(self, queue: QueueState) -> tuple[object, ...]:
        key = self._name_keys.get(queue.name)
        if key is None:
            key = self._name_keys[queue.name] = natural_key(queue.name)
        return key

    # -- preempt -----------------------------------------------------------------------

    def preempt(self) -> None:
        """Within one queue, higher-priority work evicts lower-priority preemptible work."""
        # The lowest priority in each queue: work at or below it has nothing to preempt.
        lowest: dict[str, int] = {}
        # The lowest priority running in each queue: only work above it can preempt, or
        # be told why it could not.
        floor: dict[str, int] = {}
        for ws in self.workloads:
            name = ws.queue.name
            priority = ws.workload.priority
            lowest[name] = min(lowest.get(name, priority), priority)
            if ws.running:
                floor[name] = min(floor.get(name, priority), priority)
        if self._settled and not any(
            candidate.workload.workload.priority
            > floor.get(candidate.workload.queue.name, math.inf)
            for candidate in self._pending()
        ):
            # The rest would only try to fit as things are, which allocate found they do
            # not (nothing was freed since; placement is greedy, so for a gang of unlike
            # tasks this could in contrived cases miss a fit that a fuller state allows).
            return
        for candidate in self._pending_in_order():
            ws = candidate.workload
            # Victims are preemptible, so evicting them never makes room within deserved.
            if deserved_block(ws, candidate.request) is not None:
                continue
            priority = ws.workload.priority

            def next_victim(ws: WorkloadState = ws, priority: int = priority) -> Unit | None:
                return self._first_unit(ws.queue, ws, priority)

            placed, _ = self._evict_for(candidate, next_victim, "preempt")
            if (
                not placed
                and priority > lowest[ws.queue.name]
                and any(
                    other.running and other.workload.priority < priority
                    for other in self.workloads
                    if other.queue is ws.queue
                )
            ):
                self._note(
                    ws,
                    f"cannot preempt: the lower-priority work in queue {ws.queue.name} is "
                    "non-preemptible or would not make room",
                )

    # -- shared by reclaim and preempt -------------------------------------------------

    def _evict_for(
        self, candidate: Candidate, next_victim: Callable[[], Unit | None], action: str
    ) -> tuple[bool, int]:
        """Evict victims one by one until the candidate fits; commit or roll back.

        Returns whether the candidate was placed and how many victims were tried."""
        state = self.state
        ws = candidate.workload
        mark = state.checkpoint()
        victims: list[tuple[Unit, list[Placement]]] = []
        self._tentative.clear()
        self._resume.clear()
        while True:
            if (
                candidate.request[0] <= state.free_gpu + EPSILON
                and self.quota_block(ws, candidate.request) is None
                and not isinstance(self._place_checked(ws, candidate.tasks), str)
            ):
                self._keep_needed(victims)
                for (victim, _), taken in victims:
                    if taken:
                        tasks = tuple(sorted(placement.task for placement in taken))
                        reason = self._eviction_reason(action, victim, ws)
                        self._record_eviction(victim, tasks, action, ws, reason)
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

    def _keep_needed(self, victims: list[tuple[Unit, list[Placement]]]) -> None:
        """Put back victims whose devices the preemptor did not need after all."""
        state = self.state
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
                if self._within_quota(victim):
                    victims[index] = (unit, [])
                    continue
            state.rollback(mark)
            if tasks is None:
                gone_whole.add(victim.name)

    @staticmethod
    def _within_quota(ws: WorkloadState) -> bool:
        """The workload's queues, as they stand now, keep their limits, and non-preemptible
        work its deserved quotas."""
        for queue in ws.queue.path:
            if not amounts_fit(queue.alloc, (0.0, 0.0, 0.0), queue.limit):
                return False
            if not ws.preemptible and not amounts_fit(
                queue.np_alloc, (0.0, 0.0, 0.0), queue.deserved
            ):
                return False
        return True

    def _room_for(self, ws: WorkloadState, placement: Placement) -> bool:
        node = self.state.by_name[placement.node]
        group = ws.tasks[placement.task]
        if node.free_cpu + EPSILON < group.cpu or node.free_memory + EPSILON < group.memory:
            return False
        share = placement.gpu / len(placement.devices) if placement.devices else 0.0
        return all(node.used[device] + share <= 1.0 + EPSILON for device in placement.devices)

    def _victim_units(self, leaf: QueueState) -> list[Unit]:
        """Victim units of a queue in the order they are taken: lowest priority first; an
        elastic workload's extra tasks before minimum gangs; idle before busy; newest first."""
        if self._units is None:
            keyed: dict[str, list[tuple[tuple[object, ...], Unit]]] = {}
            for ws in self.workloads:
                if not ws.original or not ws.preemptible:
                    continue
                workload = ws.workload
                rank = (0 if workload.idle else 1, -workload.submitted, workload.name)
                entries = keyed.setdefault(ws.queue.name, [])
                for task in ws.original:
                    if task >= workload.min_tasks:
                        entries.append(((workload.priority, 0, *rank, -task), (ws, (task,))))
                entries.append(((workload.priority, 1, *rank, 0), (ws, None)))
            self._units = {
                name: [unit for _, unit in sorted(entries, key=lambda item: item[0])]
                for name, entries in keyed.items()
            }
        return self._units.get(leaf.name, [])

    def _first_unit(
        self,
        leaf: QueueState,
        ws: WorkloadState,
        below_priority: int | None,
        on_node: int | None = None,
    ) -> Unit | None:
        """The first victim unit of `leaf` still in place that could make room for `ws`
        (only units below `below_priority`, and with a task on node `on_node`, when
        given)."""
        units = self._victim_units(leaf)
        start = self._cursor.get(leaf.name, 0)
        while start < len(units) and units[start][0].name in self.touched:
            start += 1
        self._cursor[leaf.name] = start
        # Nothing passed over earlier in this attempt becomes usable again during it.
        start = max(start, self._resume.get(leaf.name, 0))
        allowed = self.placer.eligible(ws)
        for position in range(start, len(units)):
            unit = units[position]
            victim, tasks = unit
            if below_priority is not None and victim.workload.priority >= below_priority:
                # Units are sorted by priority: nothing further down qualifies either.
                self._resume[leaf.name] = position
                return None
            if victim.name in self.touched or victim.started or id(unit) in self._tentative:
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
                self.state.by_name[victim.running[task].node].index in allowed for task in running
            ):
                continue
            if on_node is not None and not any(
                self.state.by_name[victim.running[task].node].index == on_node for task in running
            ):
                continue
            self._resume[leaf.name] = position + 1
            return unit
        self._resume[leaf.name] = len(units)
        return None

    def _record_eviction(
        self, ws: WorkloadState, tasks: tuple[int, ...], action: str, by: WorkloadState, why: str
    ) -> None:
        self.evictions.append(Eviction(ws.name, tasks, action, by.name, why))
        self.touched.add(ws.name)
        self._settled = False

    @staticmethod
    def _eviction_reason(action: str, victim: WorkloadState, by: WorkloadState) -> str:
        if action == "preempt":
            return (
                f"{by.name} (priority {by.workload.priority}) preempts lower-priority work "
                f"(priority {victim.workload.priority}) in queue {victim.queue.name}"
            )
        over, under = _diverging(victim.queue, by.queue)
        why = (
            "under its deserved quota"
            if under.alloc[0] <= under.deserved[0] + EPSILON
            else "under its fair share"
        )
        return f"queue {over.name} is over its fair share; {under.name} is {why}"

    # -- the order of pending work for consolidate, reclaim and preempt ----------------

    def _pending(self) -> Iterator[Candidate]:
        """The candidates of `_pending_in_order`, in no particular order."""
        for ws in self.waiting:
            if not ws.running and not ws.started and ws.name not in self.touched:
                yield self._gang_candidate(ws)

    def _pending_in_order(self) -> Iterator[Candidate]:
        order = FairOrder(list(self.queues.values()))
        for pending in self._pending():
            order.add(pending)
        order.refresh_all(list(self.queues.values()))
        while (candidate := order.pop()) is not None:
            if not candidate.workload.running:
                yield candidate
            order.refresh(candidate.workload.queue)

    # -- results -----------------------------------------------------------------------

    def decisions(self) -> Decisions:
        bindings = {
            ws.name: tuple(ws.started[task] for task in sorted(ws.started))
            for ws in self.workloads
            if ws.started
        }
        last_eviction = {eviction.workload: eviction for eviction in self.evictions}
        pending: dict[str, str] = {}
        for ws in self.workloads:
            if ws.running:
                continue
            eviction = last_eviction.get(ws.name)
            if eviction is not None:
                pending[ws.name] = f"{eviction.action}ed for {eviction.by}: {eviction.reason}"
            else:
                pending[ws.name] = ws.reason or "not considered this cycle"
        queues = {
            name: QueueStatus(
                deserved=as_resources(queue.deserved),
                limit=as_resources(queue.limit),
                fair_share=as_resources(queue.fair_share),
                allocated=as_resources(queue.alloc),
                requested=as_resources(queue.requested),
            )
            for name, queue in self.queues.items()
        }
        return Decisions(bindings, tuple(self.evictions), pending, queues)


def _build_queues(snapshot: Snapshot) -> dict[str, QueueState]:
    try:
        check_tree(snapshot.queues)
    except UnknownParent as error:
        raise ValueError(f"queue {error.queue}: unknown parent {error.parent!r}") from None
    except QueueCycle as error:
        raise ValueError(f"queue {error.queue}: the queue tree has a cycle") from None
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
    return queues


def limit_block(ws: WorkloadState, request: Request) -> str | None:
    """Limits cap every workload, at its queue and at each ancestor."""
    for queue in ws.queue.path:
        if not amounts_fit(queue.alloc, request, queue.limit):
            resource = _first_over(queue.alloc, request, queue.limit)
            return (
                f"queue {queue.name} would exceed its limit of "
                f"{amount_text(resource, queue.limit[resource])}"
            )
    return None


def deserved_block(ws: WorkloadState, request: Request) -> str | None:
    """Non-preemptible work must keep its queue and every ancestor within deserved."""
    if ws.preemptible:
        return None
    for queue in ws.queue.path:
        if not amounts_fit(queue.np_alloc, request, queue.deserved):
            resource = _first_over(queue.np_alloc, request, queue.deserved)
            deserved = queue.deserved[resource]
            free = max(deserved - queue.np_alloc[resource], 0.0)
            needs = f"non-preemptible workload needs {amount_text(resource, request[resource])}"
            if deserved <= EPSILON:
                return f"{needs} but {queue.name} has no {_deserved_text(resource, 0)}"
            return (
                f"{needs} but {queue.name} has {_bare(resource, free)} of its "
                f"{_deserved_text(resource, deserved)} free"
            )
    return None


def amount_text(resource: int, amount: float) -> str:
    if resource == 0:
        return plural_gpus(amount)
    if resource == 1:
        return f"{format_gpus(amount)} CPU cores"
    return f"{format_memory(amount)} memory"


def _deserved_text(resource: int, deserved: float) -> str:
    """ "2 deserved GPUs"; with 0, the bare noun ("deserved GPUs") for "has no ..."."""
    amount = "" if deserved <= EPSILON else f"{format_gpus(deserved)} "
    if resource == 0:
        return f"{amount}deserved {'GPU' if 0 < deserved <= 1 else 'GPUs'}"
    if resource == 1:
        return f"{amount}deserved CPU cores"
    if not amount:
        return "deserved memory"
    return f"{format_memory(deserved)} of deserved memory"


def _first_over(used: list[float], request: Request, cap: list[float]) -> int:
    for resource in range(3):
        if used[resource] + request[resource] > cap[resource] + EPSILON:
            return resource
    return 0


def _bare(resource: int, amount: float) -> str:
    return format_gpus(amount) if resource < 2 else format_memory(amount)


def _within_fair_share(queue: QueueState, request: Request) -> int:
    """How many queues of `queue.path`, from the leaf up, stay within their fair share
    with `request` added."""
    reach = 0
    for level in queue.path:
        for resource in range(3):
            if request[resource] > EPSILON and (
                level.alloc[resource] + request[resource] > level.fair_share[resource] + EPSILON
            ):
                return reach
        reach += 1
    return reach


def _over_below(
    leaf: QueueState,
    reclaimer_path: set[str],
    meeting: set[str],
    root_allowed: bool,
    request: Request,
) -> bool:
    """True when every queue from `leaf` up to where its path meets the reclaimer's is over
    its fair share, and the paths meet where the reclaimer may take from."""
    for level in leaf.path:
        if level.name in reclaimer_path:
            return level.name in meeting
        if not _over_fair_share(level, request):
            return False
    return root_allowed


def _over_fair_share(queue: QueueState, request: Request) -> bool:
    return any(
        request[resource] > EPSILON and queue.alloc[resource] > queue.fair_share[resource] + EPSILON
        for resource in range(3)
    )


def _served_ratio(queue: QueueState, request: Request) -> float:
    """Allocation over fair share on the dominant requested resource."""
    ratio = 0.0
    for resource in range(3):
        if request[resource] <= EPSILON:
            continue
        share = queue.fair_share[resource]
        alloc = queue.alloc[resource]
        ratio = max(ratio, math.inf if share <= EPSILON else alloc / share)
    return ratio


def _diverging(a: QueueState, b: QueueState) -> tuple[QueueState, QueueState]:
    """The queues on the paths of `a` and `b` just below where the two paths meet."""
    b_names = [queue.name for queue in b.path]
    for index, queue in enumerate(a.path):
        if queue.name in b_names:
            return a.path[max(index - 1, 0)], b.path[max(b_names.index(queue.name) - 1, 0)]
    return a.path[-1], b.path[-1]
