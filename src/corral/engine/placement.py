"""Where tasks go: nodes, devices, fractions and topology domains.

`Placer.place` binds a set of tasks of one workload into the tentative state, all of them
or none (a gang), and says why when they do not fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from corral.engine.admission import Largest, too_big
from corral.engine.fragmentation import Fragmentation
from corral.engine.state import Allowed, ClusterState, NodeState, WorkloadState, natural_key
from corral.model import Placement, SchedulerConfig, TaskGroup
from corral.model.resources import EPSILON, format_gpus, format_memory, plural_gpus


def _round_share(value: float) -> float:
    return round(value, 9)


# Bounds on the candidates scored for one task, so that placement stays fast: per kind of
# node and number of wholly free devices (or per free share of a partly used device), the
# first fitting nodes in name order, looking at a limited number; and a limited number of
# distinct free shares. When the bounded search finds nothing, every node is looked at.
FITTING_PER_BUCKET = 8
SCANNED_PER_BUCKET = 64
DEVICE_SHARES = 12
# An allowed set this small (a topology domain, one node) is searched whole.
SMALL_ALLOWED = 64


@dataclass(frozen=True, slots=True)
class Failure:
    """A placement that did not work: how many tasks fitted, and why not all."""

    placed: int
    reason: str


def describe_task(group: TaskGroup) -> str:
    """ "1 GPU", "0.5 GPU", "20GiB of GPU memory", with CPU and memory when asked for."""
    parts = []
    if group.gpu_memory > 0:
        parts.append(f"{format_memory(group.gpu_memory)} of GPU memory")
    elif group.gpu > 0:
        parts.append(plural_gpus(group.gpu))
    if group.cpu > 0:
        parts.append(f"{format_gpus(group.cpu)} CPU cores")
    if group.memory > 0:
        parts.append(f"{format_memory(group.memory)} memory")
    return ", ".join(parts) or "no resources"


def selector_text(selector: Mapping[str, tuple[str, ...]]) -> str:
    return ", ".join(f"{key}={'|'.join(values)}" for key, values in sorted(selector.items()))


class Placer:
    """Places tasks into a ClusterState according to the scheduler configuration."""

    def __init__(
        self,
        state: ClusterState,
        config: SchedulerConfig,
        fragmentation: Fragmentation | None = None,
    ) -> None:
        self.state = state
        self.binpack = config.placement == "binpack"
        self.pack_fractions = config.gpu_placement == "pack"
        # Fragmentation-aware placement refines binpack with packed fractions.
        self.fragmentation = fragmentation if self.binpack and self.pack_fractions else None
        self._kinds_for: dict[Allowed, list[int]] = {}
        # What depends only on the nodes, or is kept until a bucket changes, lives as long
        # as the state (a Scheduler keeps it from cycle to cycle).
        self._eligible = state.caches.eligible
        self._largest_cache = state.caches.largest
        self._bucket_cache = state.caches.buckets
        self._max_device_memory = state.max_memory
        # Nodes a workload may not use this cycle (held by reservations), when any are.
        self.hold: Callable[[WorkloadState], frozenset[int]] | None = None
        self._without: dict[tuple[Allowed, frozenset[int]], frozenset[int]] = {}

    # -- which nodes a workload may use ---------------------------------------------

    def eligible(self, workload: WorkloadState) -> Allowed:
        """Schedulable nodes matching the workload's node selector; None means all of them."""
        selector = workload.workload.node_selector
        if not selector:
            return None
        key = tuple(sorted(selector.items()))
        found = self._eligible.get(key)
        if found is None:
            found = frozenset(
                node.index
                for node in self.state.nodes
                if node.node.schedulable
                and all(node.node.label(label) in values for label, values in selector.items())
            )
            self._eligible[key] = found
        return found

    def allowed_for(self, workload: WorkloadState) -> Allowed:
        """The nodes `workload` may be placed on now: `eligible` less the nodes that
        reservations hold against it."""
        allowed = self.eligible(workload)
        if self.hold is None:
            return allowed
        held = self.hold(workload)
        if not held:
            return allowed
        key = (allowed, held)
        found = self._without.get(key)
        if found is None:
            nodes = self.nodes_of(allowed)
            found = self._without[key] = frozenset(
                node.index for node in nodes if node.index not in held
            )
        return found

    def nodes_of(self, allowed: Allowed) -> Iterable[NodeState]:
        if allowed is None:
            return (node for node in self.state.nodes if node.node.schedulable)
        return (self.state.nodes[index] for index in sorted(allowed))

    # -- placing a gang ----------------------------------------------------------------

    def place(self, workload: WorkloadState, tasks: list[int]) -> list[Placement] | Failure:
        """Bind `tasks` of `workload` into the state, all or none."""
        allowed = self.allowed_for(workload)
        if allowed is not None and not allowed:
            selector = selector_text(workload.workload.node_selector)
            return Failure(0, f"no schedulable node matches node selector {selector}")
        topology = workload.workload.topology
        anchor = next((p for t, p in workload.running.items() if t not in tasks), None)
        if topology is not None and anchor is not None:
            # A workload that already runs grows within the domain it runs in.
            value = self.state.by_name[anchor.node].node.label(topology.key)
            domain = self._group_by_label(topology.key, allowed).get(value or "", frozenset())
            result = self._place_all(workload, tasks, domain)
            if not isinstance(result, int):
                return result
            if topology.required:
                return Failure(result, f"no room to grow within its {topology.key} {value}")
        if topology is None:
            result = self._place_all(workload, tasks, allowed)
            if isinstance(result, int):
                return Failure(result, self._explain(workload, tasks, result, allowed, None))
            return result
        best = 0
        for domain_nodes in self._domains(workload, tasks, topology.key, allowed):
            outcome = self._place_all(workload, tasks, domain_nodes)
            if not isinstance(outcome, int):
                return outcome
            best = max(best, outcome)
        if not topology.required:
            result = self._place_all(workload, tasks, allowed)
            if isinstance(result, int):
                return Failure(result, self._explain(workload, tasks, result, allowed, None))
            return result
        best = max(best, self._best_partial(workload, tasks, topology.key, allowed))
        return Failure(best, self._explain(workload, tasks, best, allowed, topology.key))

    def _place_all(
        self, workload: WorkloadState, tasks: list[int], allowed: Allowed
    ) -> list[Placement] | int:
        """Place every task or none; on failure returns how many had fitted."""
        state = self.state
        mark = state.checkpoint()
        placements: list[Placement] = []
        for task in tasks:
            placement = self.place_task(workload.tasks[task], task, allowed)
            if placement is None:
                state.rollback(mark)
                return len(placements)
            state.bind(workload, placement)
            placements.append(placement)
        return placements

    def _domains(
        self, workload: WorkloadState, tasks: list[int], key: str, allowed: Allowed
    ) -> list[frozenset[int]]:
        """Domains of label `key` with room for the tasks, fullest first."""
        request = sum(self.nominal_gpu(workload.tasks[task]) for task in tasks)
        domains = self._group_by_label(key, allowed)
        ranked = []
        for value, members in domains.items():
            free = sum(self.state.nodes[index].free_gpu for index in members)
            if free + EPSILON < request:
                continue
            fullness = request / free if free > 0 else 1.0
            ranked.append((-fullness, natural_key(value), members))
        ranked.sort(key=lambda item: (item[0], item[1]))
        return [members for _, _, members in ranked]

    def _best_partial(
        self, workload: WorkloadState, tasks: list[int], key: str, allowed: Allowed
    ) -> int:
        """The most tasks that fit in any single domain (only used to explain a failure)."""
        best = 0
        for members in self._group_by_label(key, allowed).values():
            mark = self.state.checkpoint()
            outcome = self._place_all(workload, tasks, members)
            self.state.rollback(mark)
            best = max(best, outcome if isinstance(outcome, int) else len(tasks))
        return best

    def domains(self, key: str, allowed: Allowed) -> dict[str, frozenset[int]]:
        """The nodes of `allowed` by their value of label `key` (nodes without it left out)."""
        return self._group_by_label(key, allowed)

    def _group_by_label(self, key: str, allowed: Allowed) -> dict[str, frozenset[int]]:
        groups: dict[str, set[int]] = {}
        for node in self.nodes_of(allowed):
            value = node.node.label(key)
            if value is not None:
                groups.setdefault(value, set()).add(node.index)
        return {value: frozenset(members) for value, members in groups.items()}

    def nominal_gpu(self, group: TaskGroup) -> float:
        if group.gpu_memory > 0 and self._max_device_memory:
            return group.gpu_memory / self._max_device_memory
        return group.gpu

    # -- placing one task --------------------------------------------------------------

    def place_task(self, group: TaskGroup, task: int, allowed: Allowed) -> Placement | None:
        """The best spot for one task given the current state, or None. Binds nothing."""
        if group.fractional:
            return self._place_fraction(group, task, allowed)
        if group.gpu >= 1:
            count = int(group.gpu)
            node = None
            if self.fragmentation is not None:
                node = self._least_fragmenting_node(count, group, allowed)
            if node is None:
                node = self._node_with_free_devices(count, group, allowed)
            if node is None:
                return None
            return Placement(task, node.name, node.free_devices(count), float(count))
        return self._place_cpu_only(group, task, allowed)

    # -- fragmentation-aware choices ---------------------------------------------------

    def _growth(
        self, node: NodeState, devices: tuple[int, ...], amount: float, group: TaskGroup
    ) -> float:
        """How much placing the task raises the node's expected fragmentation (rounded, so
        that equal choices tie and fall back to the usual order)."""
        assert self.fragmentation is not None
        per_device = amount / len(devices) if devices else 0.0
        growth = self.fragmentation.change(
            node.kind,
            node.used,
            node.free_cpu,
            devices,
            per_device,
            group.cpu,
        )
        return round(growth, 6)

    def _kinds(self, allowed: Allowed) -> list[int]:
        """Kinds of node with at least one node in `allowed`."""
        found = self._kinds_for.get(allowed)
        if found is None:
            kinds = {node.kind for node in self.nodes_of(allowed)}
            found = self._kinds_for[allowed] = sorted(kinds)
        return found

    def _nodes_with_free_devices(
        self, count: int, group: TaskGroup, allowed: Allowed
    ) -> Iterator[NodeState]:
        """Candidate nodes with `count` wholly free devices and room for the task's host
        needs: a small allowed set whole, else the first few of each kind and count."""
        state = self.state
        nodes = state.nodes
        if allowed is not None and len(allowed) <= SMALL_ALLOWED:
            for index in sorted(allowed):
                node = nodes[index]
                if (
                    node.node.schedulable
                    and node.free_whole >= count
                    and self._host_fits(node, group)
                ):
                    yield node
            return
        kinds = self._kinds(allowed)
        kind_buckets = state.kind_buckets
        for free in range(count, state.max_devices + 1):
            for kind in kinds:
                if not kind_buckets[kind][free]:
                    continue  # empty: nothing to offer (and no answer to keep)
                for index in self._bucket_candidates(kind, free, group, allowed):
                    yield nodes[index]

    def _bucket_candidates(
        self, kind: int, free: int, group: TaskGroup, allowed: Allowed
    ) -> list[int]:
        """The nodes `_nodes_with_free_devices` offers from one bucket. Most placements
        change one or two buckets, so the answer is kept until the bucket changes."""
        state = self.state
        stamp = state.bucket_stamps[kind][free]
        key = (kind, free, group.cpu, group.memory, allowed)
        kept = self._bucket_cache.get(key)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        nodes = state.nodes
        cpu, memory = group.cpu, group.memory
        found: list[int] = []
        bucket = state.kind_buckets[kind][free]
        # Every node here runs nothing and looks the same: the first one that may be used
        # stands for all (what the scan finds, without looking at the others).
        alike = free == state.kind_gpus[kind] and state.pristine[kind] == len(bucket)
        # Nodes in the same state score the same: the first of them stands for all.
        seen: set[tuple[tuple[float, ...], float, float]] = set()
        for scanned, index in enumerate(bucket):
            if scanned == SCANNED_PER_BUCKET:
                break
            if allowed is not None and index not in allowed:
                continue
            node = nodes[index]
            if node.free_cpu + EPSILON >= cpu and node.free_memory + EPSILON >= memory:
                look = (tuple(node.used), node.free_cpu, node.free_memory)
                if look in seen:
                    continue
                seen.add(look)
                found.append(index)
                if len(seen) == FITTING_PER_BUCKET:
                    break
            if alike:
                break
        self._bucket_cache[key] = (stamp, found)
        return found

    def _least_fragmenting_node(
        self, count: int, group: TaskGroup, allowed: Allowed
    ) -> NodeState | None:
        """Among candidate nodes, the one whose expected fragmentation grows least; ties go
        to the fewest wholly free devices, then the first name."""
        best: NodeState | None = None
        best_key = (0.0, 0, 0)
        for node in self._nodes_with_free_devices(count, group, allowed):
            key = (
                self._growth(node, node.free_devices(count), float(count), group),
                node.free_whole,
                node.index,
            )
            if best is None or key < best_key:
                best, best_key = node, key
        return best

    def _least_fragmenting_device(
        self, group: TaskGroup, task: int, allowed: Allowed
    ) -> Placement | None:
        """For a fraction, as with pack a partly used device when one has room, else a
        wholly free one: of the candidates, the device whose node's expected fragmentation
        grows least; ties go to the fullest device, then to the node with the fewest
        wholly free devices, then to the first name."""
        best: Placement | None = None
        best_key: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)
        for free, node, device in self._shared_devices(group, allowed):
            amount = group.gpu_on(node.node)
            if free + EPSILON < amount or not self._host_fits(node, group):
                continue
            key = (self._growth(node, (device,), amount, group), free, node.index, device)
            if best is None or key < best_key:
                best, best_key = Placement(task, node.name, (device,), amount), key
        if best is not None:
            return best
        for node in self._nodes_with_free_devices(1, group, allowed):
            amount = group.gpu_on(node.node)
            if amount > 1.0 + EPSILON:
                continue
            devices = node.free_devices(1)
            key = (
                self._growth(node, devices, amount, group),
                float(node.free_whole),
                node.index,
                0,
            )
            if best is None or key < best_key:
                best, best_key = Placement(task, node.name, devices, amount), key
        return best

    def _node_with_free_devices(
        self, count: int, group: TaskGroup, allowed: Allowed
    ) -> NodeState | None:
        """binpack: the node with the fewest wholly free devices that has `count`;
        spread: the one with the most. Ties go to the first name."""
        state = self.state
        if count > state.max_devices:
            return None
        counts = (
            range(count, state.max_devices + 1)
            if self.binpack
            else range(state.max_devices, count - 1, -1)
        )
        nodes = state.nodes
        cpu = group.cpu - EPSILON
        memory = group.memory - EPSILON
        for free in counts:
            for index in state.buckets[free]:
                if allowed is not None and index not in allowed:
                    continue
                node: NodeState = nodes[index]
                if node.free_cpu >= cpu and node.free_memory >= memory:
                    return node
        return None

    def _shared_devices(
        self, group: TaskGroup, allowed: Allowed
    ) -> Iterator[tuple[float, NodeState, int]]:
        """Candidate partly used devices with room for the task's nominal share: of a small
        allowed set all of them, else for each free share from the fullest up the first few
        nodes in different states."""
        state = self.state
        lowest = self.nominal_gpu(group) - EPSILON
        if allowed is not None and len(allowed) <= SMALL_ALLOWED:
            for index in sorted(allowed):
                node = state.nodes[index]
                if node.node.schedulable:
                    for device, used in enumerate(node.used):
                        if 0.0 < used < 1.0 and 1.0 - used >= lowest:
                            yield _round_share(1.0 - used), node, device
            return
        start: tuple[float, ...] = (lowest,)
        for _ in range(DEVICE_SHARES):
            share: float | None = None
            seen: set[tuple[tuple[float, ...], float, float]] = set()
            for scanned, (free, index, device) in enumerate(state.partial.irange(minimum=start)):
                if share is None:
                    share = free
                elif free != share or scanned == SCANNED_PER_BUCKET:
                    break
                if allowed is not None and index not in allowed:
                    continue
                node = state.nodes[index]
                # The same share on a node in the same state scores the same.
                look = (tuple(node.used), node.free_cpu, node.free_memory)
                if look in seen:
                    continue
                seen.add(look)
                yield free, node, device
                if len(seen) == FITTING_PER_BUCKET:
                    break
            if share is None:
                return
            start = (share, math.inf)

    def _place_fraction(self, group: TaskGroup, task: int, allowed: Allowed) -> Placement | None:
        if self.fragmentation is not None:
            found = self._least_fragmenting_device(group, task, allowed)
            if found is not None:
                return found
        if self.pack_fractions:
            return self._shared_device(group, task, allowed, fullest=True) or self._fresh_device(
                group, task, allowed
            )
        return self._fresh_device(group, task, allowed) or self._shared_device(
            group, task, allowed, fullest=False
        )

    def _fresh_device(self, group: TaskGroup, task: int, allowed: Allowed) -> Placement | None:
        state = self.state
        counts = range(1, state.max_devices + 1)
        if not self.binpack:
            counts = range(state.max_devices, 0, -1)
        for free in counts:
            for index in state.buckets[free]:
                if allowed is not None and index not in allowed:
                    continue
                node = state.nodes[index]
                amount = group.gpu_on(node.node)
                if amount > 1.0 + EPSILON or not self._host_fits(node, group):
                    continue
                return Placement(task, node.name, node.free_devices(1), amount)
        return None

    def _shared_device(
        self, group: TaskGroup, task: int, allowed: Allowed, fullest: bool
    ) -> Placement | None:
        """A partly used device with room: the fullest that fits (pack) or the emptiest."""
        state = self.state
        lowest = self.nominal_gpu(group) - EPSILON
        candidates = state.partial.irange(minimum=(lowest,)) if fullest else reversed(state.partial)
        for free, index, device in candidates:
            if allowed is not None and index not in allowed:
                continue
            node = state.nodes[index]
            amount = group.gpu_on(node.node)
            if free + EPSILON < amount or not self._host_fits(node, group):
                continue
            return Placement(task, node.name, (device,), amount)
        return None

    def _place_cpu_only(self, group: TaskGroup, task: int, allowed: Allowed) -> Placement | None:
        """The node with the fewest free GPUs where the task fits, so that work without
        GPUs does not take the CPU that free GPUs need; then the least free CPU (binpack)
        or the most (spread)."""
        best: NodeState | None = None
        best_key = (0.0, 0.0)
        sign = 1.0 if self.binpack else -1.0
        for node in self.nodes_of(allowed):
            if not self._host_fits(node, group):
                continue
            key = (node.free_gpu, sign * node.free_cpu)
            if best is None or key < best_key:
                best, best_key = node, key
        if best is None:
            return None
        return Placement(task, best.name, (), 0.0)

    @staticmethod
    def _host_fits(node: NodeState, group: TaskGroup) -> bool:
        return node.free_cpu + EPSILON >= group.cpu and node.free_memory + EPSILON >= group.memory

    # -- explaining a failure ----------------------------------------------------------

    def _explain(
        self,
        workload: WorkloadState,
        tasks: list[int],
        placed: int,
        allowed: Allowed,
        domain_key: str | None,
    ) -> str:
        group = workload.tasks[tasks[min(placed, len(tasks) - 1)]]
        shape = describe_task(group)
        # Not `allowed`: reservations may narrow it for a workload with no selector.
        where = " matching its node selector" if workload.workload.node_selector else ""
        too_big = self._too_big(group, allowed)
        if too_big:
            return too_big
        if len(tasks) > 1:
            scope = f" in any single {domain_key}" if domain_key else ""
            noun = "gang" if placed < workload.workload.min_tasks else "workload"
            fitted = f"only {placed} fit" if placed else "none fit"
            return f"{noun} needs {len(tasks)} tasks of {shape}; {fitted}{scope}{where}"
        if group.fractional:
            return f"no device{where} has {shape} free"
        if group.gpu >= 1:
            free = self.state.free_gpu
            return (
                f"no node{where} has {shape} free"
                f" (the cluster has {plural_gpus(max(free, 0.0))} free in all)"
            )
        return f"no node{where} has {shape} free"

    def too_big(self, workload: WorkloadState, tasks: list[int]) -> str | None:
        """Why some task can never fit on any eligible node, even an empty one, or None."""
        allowed = self.eligible(workload)
        # In task order (a set would name a different group from one process to the next).
        # A group's tasks are one object, one after another: each group is checked once.
        last = None
        for task in tasks:
            group = workload.tasks[task]
            if group is last:
                continue
            last = group
            reason = self._too_big(group, allowed)
            if reason is not None:
                return reason
        return None

    def _largest(self, allowed: Allowed) -> Largest | None:
        """The largest device count, device memory, CPU and memory among eligible nodes."""
        if allowed not in self._largest_cache:
            self._largest_cache[allowed] = Largest.of(node.node for node in self.nodes_of(allowed))
        return self._largest_cache[allowed]

    def _too_big(self, group: TaskGroup, allowed: Allowed) -> str | None:
        """Why one task of `group` fits no eligible node, even an empty one (the rule of
        `engine.admission.too_big`, in the words of a pending reason)."""
        largest = self._largest(allowed)
        if largest is None:
            return "no schedulable node in the cluster"
        resource = too_big(group, largest)
        if resource == "gpu":
            return (
                f"each task needs {plural_gpus(group.gpu)} but the largest node has "
                f"{plural_gpus(largest.gpus)}"
            )
        if resource == "gpu_memory":
            return (
                f"each task needs {format_memory(group.gpu_memory)} of GPU memory but the "
                f"largest device has {format_memory(largest.gpu_memory)}"
            )
        if resource == "cpu":
            return f"each task needs {format_gpus(group.cpu)} CPU cores, more than any node has"
        if resource == "memory":
            return f"each task needs {format_memory(group.memory)} memory, more than any node has"
        return None
