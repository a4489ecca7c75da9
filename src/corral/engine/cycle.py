"""One scheduling cycle: allocate, consolidate, reclaim, preempt.

`schedule(snapshot, config)` is pure and deterministic: the same input always gives the
same decisions. Every action works on one tentative ClusterState; an attempt that evicts
or moves work is simulated first and committed only when the workload it is for really
fits, otherwise it is rolled back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from corral.engine.fairshare import divide_tree
from corral.engine.fragmentation import Fragmentation, shapes_of
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
    QueueStatus,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from corral.model.resources import EPSILON, format_gpus, format_memory, plural_gpus

# A victim: some running tasks of one workload, evicted together. `tasks` None means
# every task still running (a whole workload, or the minimum gang of an elastic one).
Unit = tuple[WorkloadState, tuple[int, ...] | None]


def schedule(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Decisions:
    """Run one scheduling cycle over `snapshot` and return what it decided."""
    cycle = Cycle(snapshot, config or SchedulerConfig())
    actions: dict[str, Callable[[], None]] = {
        "allocate": cycle.allocate,
        "consolidate": cycle.consolidate,
        "reclaim": cycle.reclaim,
        "preempt": cycle.preempt,
    }
    for action in cycle.config.actions:
        if action not in actions:
            raise ValueError(f"unknown action {action!r}; expected one of {', '.join(actions)}")
        actions[action]()
    return cycle.decisions()


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


class Cycle:
    """The state of one cycle and its four actions."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig) -> None:
        self.config = config
        self.queues = _build_queues(snapshot)
        fragmentation = Fragmentation(
            snapshot.nodes,
            shapes_of(
                (*((workload, 1) for workload in snapshot.workloads), *snapshot.hidden),
                max((node.gpu_memory for node in snapshot.nodes if node.gpus), default=0),
            ),
        )
        self.state = ClusterState(snapshot.nodes, self.queues, fragmentation.kind_of)
        self.placer = Placer(self.state, config, fragmentation)
        self.workloads: list[WorkloadState] = []
        self.by_node: dict[str, list[WorkloadState]] = {}
        for workload in sorted(snapshot.workloads, key=lambda w: (w.submitted, w.name)):
            queue = self.queues.get(workload.queue)
            if queue is None or not queue.leaf:
                raise ValueError(
                    f"workload {workload.name}: {workload.queue!r} is not a leaf queue"
                )
            ws = WorkloadState(workload, queue, workload.tasks())
            self.workloads.append(ws)
            on_nodes: set[str] = set()
            for placement in workload.placements:
                if placement.node not in self.state.by_name:
                    raise ValueError(f"workload {ws.name}: unknown node {placement.node!r}")
                self.state.load(ws, placement)
                ws.original[placement.task] = placement
                if placement.node not in on_nodes:
                    on_nodes.add(placement.node)
                    self.by_node.setdefault(placement.node, []).append(ws)
        self.state.index()
        self._compute_fair_shares()
        self.evictions: list[Eviction] = []
        # Workloads evicted or moved this cycle are not victims again in the same cycle.
        self.touched: set[str] = set()
        self._units: dict[str, list[Unit]] | None = None
        # Victim lists are consumed front first: where each queue's untouched units start.
        self._cursor: dict[str, int] = {}
        self._tentative: set[int] = set()

    # -- fair share --------------------------------------------------------------------

    def _compute_fair_shares(self) -> None:
        for ws in self.workloads:
            request = self.request_of(ws, range(len(ws.tasks)))
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
            self.queues[name].fair_share[:] = share

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

    def _gang_candidate(self, ws: WorkloadState) -> Candidate:
        tasks = list(range(ws.workload.min_tasks))
        return Candidate(ws, tasks, self.request_of(ws, tasks), growth=False)

    def _growth_candidate(self, ws: WorkloadState) -> Candidate:
        tasks = ws.unplaced()[:1]
        return Candidate(ws, tasks, self.request_of(ws, tasks), growth=True)

    def _try_place(self, candidate: Candidate) -> bool:
        ws = candidate.workload
        reason = self.quota_block(ws, candidate.request)
        if reason is None and not candidate.growth:
            reason = self.placer.too_big(ws, candidate.tasks)
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
        for candidate in self._pending_in_order():
            ws = candidate.workload
            if ws.workload.topology is not None or self.quota_block(ws, candidate.request):
                continue
            # Moves keep every workload placed, so only capacity free somewhere can help;
            # it may sit on nodes the candidate cannot use, where moved work can go.
            if candidate.request[0] > self.state.free_gpu + EPSILON:
                continue
            self._consolidate_for(ws, candidate.tasks, self.placer.eligible(ws))

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
        """Queues under their fair share take GPUs back from queues above theirs."""
        everything = (1.0, 1.0, 1.0)
        if not any(
            queue.leaf and _over_fair_share(queue, everything) for queue in self.queues.values()
        ):
            return
        # Whether another queue is over its fair share changes only when a reclaim is made.
        anyone_over: dict[tuple[str, bool, bool, bool], bool] = {}
        for candidate in self._pending_in_order():
            ws = candidate.workload
            if self.quota_block(ws, candidate.request) is not None:
                continue
            request = candidate.request
            key = (ws.queue.name, request[0] > EPSILON, request[1] > EPSILON, request[2] > EPSILON)
            anyone = anyone_over.get(key)
            if anyone is None:
                anyone = anyone_over[key] = self._anyone_over_fair_share(ws, request)
            if not anyone:
                continue
            reach = _within_fair_share(ws.queue, candidate.request)
            if reach == 0:
                queue = ws.queue
                resource = _first_over(queue.alloc, candidate.request, queue.fair_share)
                share = amount_text(resource, queue.fair_share[resource])
                self._note(
                    ws, f"cannot reclaim: queue {queue.name} would exceed its fair share of {share}"
                )
                continue
            placed, tried = self._evict_for(
                candidate, self._reclaim_victims(candidate, reach), "reclaim"
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

    def _anyone_over_fair_share(self, ws: WorkloadState, request: Request) -> bool:
        return any(
            leaf.leaf and leaf is not ws.queue and _over_fair_share(leaf, request)
            for leaf in self.queues.values()
        )

    @staticmethod
    def _note(ws: WorkloadState, note: str) -> None:
        """Add what a later action found to the workload's pending reason."""
        ws.reason = f"{ws.reason}; {note}" if ws.reason else note

    def _reclaim_victims(self, candidate: Candidate, reach: int) -> Callable[[], Unit | None]:
        ws = candidate.workload
        path = ws.queue.path
        ancestors = {queue.name for queue in path}
        # The victim's branch must split from the reclaimer's at an ancestor below which
        # the reclaimer stays within its fair share (the root counts when all of it does).
        meeting = {queue.name for queue in path[1 : reach + 1]}
        root_allowed = reach >= len(path)

        def next_victim() -> Unit | None:
            ranked = []
            for leaf in self.queues.values():
                if not leaf.leaf or leaf is ws.queue:
                    continue
                if _over_below(leaf, ancestors, meeting, root_allowed, candidate.request):
                    ratio = _served_ratio(leaf, candidate.request)
                    ranked.append(((-ratio, -leaf.alloc[0], natural_key(leaf.name)), leaf))
            ranked.sort(key=lambda item: item[0])
            for _, leaf in ranked:
                unit = self._first_unit(leaf, ws, None)
                if unit is not None:
                    return unit
            return None

        return next_victim

    # -- preempt -----------------------------------------------------------------------

    def preempt(self) -> None:
        """Within one queue, higher-priority work evicts lower-priority preemptible work."""
        # The lowest priority in each queue: work at or below it has nothing to preempt.
        lowest: dict[str, int] = {}
        for ws in self.workloads:
            name = ws.queue.name
            lowest[name] = min(lowest.get(name, ws.workload.priority), ws.workload.priority)
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
        self, leaf: QueueState, ws: WorkloadState, below_priority: int | None
    ) -> Unit | None:
        """The first victim unit of `leaf` still in place that could make room for `ws`
        (only units below `below_priority`, when given)."""
        units = self._victim_units(leaf)
        start = self._cursor.get(leaf.name, 0)
        while start < len(units) and units[start][0].name in self.touched:
            start += 1
        self._cursor[leaf.name] = start
        allowed = self.placer.eligible(ws)
        for unit in units[start:]:
            victim, tasks = unit
            if below_priority is not None and victim.workload.priority >= below_priority:
                # Units are sorted by priority: nothing further down qualifies either.
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
            return unit
        return None

    def _record_eviction(
        self, ws: WorkloadState, tasks: tuple[int, ...], action: str, by: WorkloadState, why: str
    ) -> None:
        self.evictions.append(Eviction(ws.name, tasks, action, by.name, why))
        self.touched.add(ws.name)

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

    def _pending_in_order(self) -> Iterator[Candidate]:
        order = FairOrder(list(self.queues.values()))
        for ws in self.workloads:
            if not ws.running and not ws.started and ws.name not in self.touched:
                order.add(self._gang_candidate(ws))
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
    queues = {queue.name: QueueState(queue, age) for age, queue in enumerate(snapshot.queues)}
    for queue in queues.values():
        parent_name = queue.queue.parent
        if parent_name is None:
            continue
        parent = queues.get(parent_name)
        if parent is None:
            raise ValueError(f"queue {queue.name}: unknown parent {parent_name!r}")
        queue.parent = parent
        parent.children.append(queue)
    for queue in queues.values():
        level: QueueState | None = queue
        while level is not None:
            if len(queue.path) > len(queues):
                raise ValueError(f"queue {queue.name}: the queue tree has a cycle")
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
