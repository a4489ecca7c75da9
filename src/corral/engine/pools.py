"""Node pools: one cycle over a cluster divided into pools, each with its own quotas.

A node's pool is its `pool` label (`default` without one). When a snapshot uses pools (a
queue gives per-pool quotas or a workload lists `node_pools`), each pool is scheduled as
a cluster of its own: its nodes, its queues with their quotas in that pool, the work
running there and the pending work that tries it. Fair share, reclaim and preemption are
therefore worked out per pool, and a queue's quota in one pool is never spent in another.

A pending workload tries its pools in its order of preference (any pool, the default
first, when it lists none). The cycle goes twice over the pools: first without evicting
anything (work that fits on free capacity in any of its pools is placed before anything
is reclaimed), then with every configured action, so that a workload reclaims or
preempts in the first of its pools where that makes room, and only there. In each pass
a workload tries its first pool, then those still pending their second, and so on.

The pools module runs the single-pool cycle it is given (`RunCycle`), so that it does
not depend on how a cycle is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

from corral.engine.errors import SnapshotError
from corral.model import (
    DEFAULT_POOL,
    Decisions,
    Eviction,
    Node,
    Placement,
    Queue,
    QueueStatus,
    Reservation,
    Resources,
    SchedulerConfig,
    Snapshot,
    Workload,
)

RunCycle = Callable[[Snapshot, SchedulerConfig], Decisions]
Apply = Callable[[Snapshot, Decisions], Snapshot]
# Actions that never evict or move running work: the first pass runs only these.
_NON_EVICTING = ("allocate",)
_NODE_POOLS = attrgetter("node_pools")


def uses_pools(snapshot: Snapshot) -> bool:
    """Whether the snapshot's queues or workloads name node pools (else the cluster is
    scheduled as one pool, as it always was)."""
    # (Looked at every cycle: the workloads' field read in C, as map does it.)
    return any(queue.pools for queue in snapshot.queues) or any(
        map(_NODE_POOLS, snapshot.workloads)
    )


def pools_of(nodes: Iterable[Node]) -> dict[str, list[Node]]:
    """The nodes of each pool, pools in name order (the default pool first)."""
    found: dict[str, list[Node]] = {}
    for node in nodes:
        found.setdefault(node.pool, []).append(node)
    return {name: found[name] for name in sorted(found, key=_pool_order)}


def _pool_order(name: str) -> tuple[bool, str]:
    return (name != DEFAULT_POOL, name)


def queues_in(queues: Sequence[Queue], pool: str) -> tuple[Queue, ...]:
    """The queues as one pool sees them: each with its deserved quota and limit there."""
    result = []
    for queue in queues:
        quota = queue.quota_in(pool)
        result.append(replace(queue, deserved=quota.deserved, limit=quota.limit, pools={}))
    return tuple(result)


@dataclass
class _Run:
    """What the cycle over all pools has decided so far."""

    current: dict[str, Workload]
    bindings: dict[str, list[Placement]] = field(default_factory=dict)
    evictions: list[Eviction] = field(default_factory=list)
    # Workloads evicted or moved this cycle: not victims, nor placed, again in it.
    touched: set[str] = field(default_factory=set)
    # The pending reason each pool gave a workload (the last pass's), and why evicted.
    reasons: dict[str, dict[str, str]] = field(default_factory=dict)
    evicted: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, Mapping[str, QueueStatus]] = field(default_factory=dict)
    # Each pool's reservations (backfill), as its last pass made them.
    reservations: dict[str, Mapping[str, Reservation]] = field(default_factory=dict)


def schedule_pools(
    snapshot: Snapshot, config: SchedulerConfig, run_cycle: RunCycle, apply: Apply
) -> Decisions:
    """One cycle over a cluster divided into node pools (see the module docstring):
    `run_cycle` schedules one pool, `apply` gives the snapshot after its decisions."""
    pools = pools_of(snapshot.nodes)
    node_pool = {node.name: node.pool for node in snapshot.nodes}
    _check(snapshot, node_pool)
    queue_views = {pool: queues_in(snapshot.queues, pool) for pool in pools}
    everywhere = tuple(pools)
    run = _Run({workload.name: workload for workload in snapshot.workloads})
    preferences = {
        workload.name: workload.node_pools or everywhere for workload in snapshot.workloads
    }
    non_evicting = tuple(action for action in config.actions if action in _NON_EVICTING)
    passes = []
    if non_evicting and non_evicting != config.actions:
        passes.append(replace(config, actions=non_evicting))
    passes.append(config)
    for settings in passes:
        depth = max((len(preferences[name]) for name in _pending(run)), default=1)
        for rank in range(depth):
            for pool in _ranked_pools(everywhere, preferences, run, rank):
                candidates = [
                    name
                    for name in _pending(run)
                    if len(preferences[name]) > rank and preferences[name][rank] == pool
                ]
                if pool not in pools:
                    for name in candidates:
                        run.reasons.setdefault(name, {})[pool] = f"no node in pool {pool}"
                    continue
                if rank > 0 and not candidates:
                    continue
                sub = _pool_snapshot(
                    snapshot, pool, pools, node_pool, queue_views[pool], run, candidates
                )
                decisions = run_cycle(sub, settings)
                _merge(run, pool, node_pool, (sub, decisions, candidates), apply)
    return _decisions(snapshot, run, preferences)


def _check(snapshot: Snapshot, node_pool: Mapping[str, str]) -> None:
    """Refuse, as a single cycle would, what the division by pool would otherwise hide: a
    workload listed twice, in a queue that is not a leaf, or on an unknown node."""
    parents = {queue.parent for queue in snapshot.queues}
    leaves = {queue.name for queue in snapshot.queues if queue.name not in parents}
    names: set[str] = set()
    for workload in snapshot.workloads:
        name = workload.name
        if workload.queue not in leaves:
            raise SnapshotError(f"workload {name}: {workload.queue!r} is not a leaf queue")
        if name in names:
            raise SnapshotError(f"workload {name}: listed twice")
        names.add(name)
        for placement in workload.placements:
            if placement.node not in node_pool:
                raise SnapshotError(f"workload {name}: unknown node {placement.node!r}")


def _pending(run: _Run) -> list[str]:
    """Workloads with no task running that were not evicted this cycle (the engine orders
    them)."""
    return [
        name
        for name, workload in run.current.items()
        if not workload.placements and name not in run.touched
    ]


def _ranked_pools(
    everywhere: tuple[str, ...],
    preferences: Mapping[str, tuple[str, ...]],
    run: _Run,
    rank: int,
) -> list[str]:
    """The pools to visit at one rank of preference: every pool with nodes at the first
    (running work is scheduled there too), and any pool a pending workload names."""
    named = {preferences[name][rank] for name in _pending(run) if len(preferences[name]) > rank}
    if rank == 0:
        named.update(everywhere)
    return sorted(named, key=_pool_order)


def _pool_snapshot(
    snapshot: Snapshot,
    pool: str,
    pools: Mapping[str, list[Node]],
    node_pool: Mapping[str, str],
    queues: tuple[Queue, ...],
    run: _Run,
    candidates: list[str],
) -> Snapshot:
    """One pool as a cluster: its nodes, its work and the candidates that try it.

    Work that started or moved earlier in this cycle is not a victim again in it, so it
    comes in non-preemptible. Work with tasks in more than one pool (placed before pools
    were in use, or a label changed under it) comes into each pool with its tasks there,
    as a gang that does not grow (see `_merge` for its eviction)."""
    workloads: list[Workload] = []
    chosen = set(candidates)
    for name, workload in run.current.items():
        if name in chosen:
            workloads.append(workload)
            continue
        if not workload.placements:
            continue
        here = tuple(p for p in workload.placements if node_pool[p.node] == pool)
        if not here:
            continue
        if len(here) < len(workload.placements):
            workload = replace(workload, placements=here, min_available=None)
        if name in run.bindings or name in run.touched:
            workload = replace(workload, preemptible=False)
        workloads.append(workload)
    # Usage is the cluster's, not the pool's: time-decayed fair share weighs the same history
    # in every pool (docs/scheduling.md, node pools).
    return Snapshot(tuple(pools[pool]), queues, tuple(workloads), snapshot.hidden, snapshot.usage)


def _merge(
    run: _Run,
    pool: str,
    node_pool: Mapping[str, str],
    step: tuple[Snapshot, Decisions, list[str]],
    apply: Apply,
) -> None:
    """Take one pool's decisions (`step`: the pool's snapshot, its decisions, and the
    candidates that tried it) into the cycle's. Work with tasks in other pools that is
    evicted here loses those tasks too: a gang runs whole or not at all."""
    sub, decisions, candidates = step
    run.statuses[pool] = decisions.queues
    run.reservations[pool] = decisions.reservations
    for name, placements in decisions.bindings.items():
        run.bindings.setdefault(name, []).extend(placements)
    for name in candidates:
        if name in decisions.pending:
            # The single-pool cycle sees its pool as the whole cluster.
            reason = decisions.pending[name].replace("the cluster", "the pool")
            run.reasons.setdefault(name, {})[pool] = reason
    changed = {eviction.workload for eviction in decisions.evictions} | set(decisions.bindings)
    elsewhere: dict[str, tuple[Placement, ...]] = {}
    if changed:
        for workload in apply(sub, decisions).workloads:
            if workload.name not in changed:
                continue
            original = run.current[workload.name]
            others = tuple(p for p in original.placements if node_pool[p.node] != pool)
            placements = workload.placements
            if others and not placements:
                elsewhere[workload.name] = others
            elif others:
                placements = tuple(sorted((*placements, *others), key=lambda p: p.task))
            # The pool's copy may have been made non-preemptible or non-elastic; keep the
            # workload's own fields and take only where its tasks now run.
            run.current[workload.name] = replace(
                original, placements=placements, running_for=workload.running_for
            )
    for eviction in decisions.evictions:
        name = eviction.workload
        others = elsewhere.pop(name, ())
        if others:
            tasks = tuple(sorted({*eviction.tasks, *(p.task for p in others)}))
            eviction = replace(eviction, tasks=tasks)
        run.evictions.append(eviction)
        run.touched.add(name)
        if name in decisions.pending:
            run.evicted[name] = decisions.pending[name]


def _decisions(
    snapshot: Snapshot, run: _Run, preferences: Mapping[str, tuple[str, ...]]
) -> Decisions:
    """The decisions of the whole cycle: every pool's, with pending reasons by pool."""
    pending: dict[str, str] = {}
    for name, workload in run.current.items():
        if workload.placements:
            continue
        if name in run.evicted:
            pending[name] = run.evicted[name]
            continue
        said = run.reasons.get(name, {})
        parts = [f"pool {pool}: {said[pool]}" for pool in preferences[name] if pool in said]
        pending[name] = "; ".join(parts) or "not considered this cycle"
    bindings = {
        name: tuple(sorted(placements, key=lambda placement: placement.task))
        for name, placements in run.bindings.items()
        if name in run.current
    }
    # Reported in the first of its pools (by its preference) that reserved nodes for it.
    reservations: dict[str, Reservation] = {}
    for name, pools in preferences.items():
        for pool in pools:
            held = run.reservations.get(pool, {}).get(name)
            if held is not None and name not in bindings:
                reservations[name] = held
                break
    return Decisions(
        bindings,
        tuple(run.evictions),
        pending,
        _totals(snapshot.queues, run.statuses),
        dict(run.statuses),
        reservations,
    )


def _totals(
    queues: Sequence[Queue], statuses: Mapping[str, Mapping[str, QueueStatus]]
) -> dict[str, QueueStatus]:
    """Each queue's amounts over every pool, added up."""
    totals: dict[str, QueueStatus] = {}
    for queue in queues:
        parts = [status[queue.name] for status in statuses.values() if queue.name in status]
        totals[queue.name] = QueueStatus(
            deserved=_sum(part.deserved for part in parts),
            limit=_sum(part.limit for part in parts),
            fair_share=_sum(part.fair_share for part in parts),
            allocated=_sum(part.allocated for part in parts),
            requested=_sum(part.requested for part in parts),
        )
    return totals


def _sum(amounts: Iterable[Resources]) -> Resources:
    gpu = cpu = memory = 0.0
    for amount in amounts:
        gpu += amount.gpu
        cpu += amount.cpu
        memory += amount.memory
    return Resources(gpu, cpu, memory)
