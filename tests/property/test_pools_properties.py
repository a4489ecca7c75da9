"""Invariants of one scheduling cycle with node pools in use, on random snapshots: the
cases of strategies.py (whose nodes carry pool labels a, b or none) with per-pool quotas
drawn for the queues and pools of preference drawn for the pending workloads."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from strategies import (
    GPU_QUOTAS,
    TOLERANCE,
    Case,
    cases,
    gang_problems,
    physical_problems,
    python_code,
    queue_paths,
)
from test_engine_properties import EXAMPLES

from corral.engine import apply_decisions, schedule
from corral.engine.admission import never_fits
from corral.model import PoolQuota, Resources, Snapshot, Workload
from corral.model.spec import WorkloadSpec

POOLS = ("a", "b", "default", "c")

CYCLE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def pooled_cases(draw: st.DrawFn) -> Case:
    """A case with pools in use: some queues give quotas in pools a and b, some pending
    workloads list pools (c has no node)."""
    case = draw(cases())
    snapshot = case.snapshot
    queues = []
    for queue in snapshot.queues:
        pools = {}
        for pool in ("a", "b"):
            if draw(st.booleans()):
                deserved = draw(st.sampled_from(GPU_QUOTAS))
                limit = draw(st.sampled_from((math.inf, deserved, deserved + 2)))
                pools[pool] = PoolQuota(
                    Resources(deserved, math.inf, math.inf), Resources(limit, math.inf, math.inf)
                )
        queues.append(replace(queue, pools=pools))
    if not any(queue.pools for queue in queues):
        queues[0] = replace(queues[0], pools={"a": PoolQuota()})
    workloads = []
    for workload in snapshot.workloads:
        if not workload.placements and draw(st.booleans()):
            chosen = draw(st.permutations(POOLS))[: draw(st.integers(1, len(POOLS)))]
            workload = replace(workload, node_pools=tuple(chosen))
        workloads.append(workload)
    pooled = Snapshot(snapshot.nodes, tuple(queues), tuple(workloads), snapshot.hidden)
    return Case(pooled, case.config, f"{case.origin}, pooled")


def _pool_usage(snapshot: Snapshot) -> dict[tuple[str, str], float]:
    """GPUs of each queue (ancestors included) in each pool."""
    pool_of = {node.name: node.pool for node in snapshot.nodes}
    paths = queue_paths(snapshot.queues)
    totals: dict[tuple[str, str], float] = {}
    for workload in snapshot.workloads:
        for placement in workload.placements:
            for name in paths[workload.queue]:
                key = (name, pool_of[placement.node])
                totals[key] = totals.get(key, 0.0) + placement.gpu
    return totals


def _pools_of(snapshot: Snapshot, workload: Workload) -> set[str]:
    pool_of = {node.name: node.pool for node in snapshot.nodes}
    return {pool_of[placement.node] for placement in workload.placements}


@CYCLE
@given(pooled_cases())
def test_pools_keep_work_in_its_pools_and_quotas_per_pool(case: Case) -> None:
    before = case.snapshot
    note(f"snapshot = {python_code(before)}")
    note(f"config = {python_code(case.config)}")
    decisions = schedule(before, case.config)
    after = apply_decisions(before, decisions)
    note(f"bindings: {dict(decisions.bindings)}; evictions: {decisions.evictions}")
    assert physical_problems(after) == []
    assert gang_problems(after) == []
    old = {workload.name: workload for workload in before.workloads}
    new = {workload.name: workload for workload in after.workloads}
    # Work that starts runs in one pool, one it lists.
    for name in decisions.bindings:
        pools = _pools_of(after, new[name])
        if not old[name].placements:
            assert len(pools) == 1, (name, pools)
            if old[name].node_pools:
                assert pools <= set(old[name].node_pools), (name, pools)
    # Reclaim and preemption take only from the pool the workload they are for starts in.
    for eviction in decisions.evictions:
        if eviction.action == "consolidate" or eviction.by not in decisions.bindings:
            continue
        by = new[eviction.by]
        if old[eviction.by].placements:
            continue
        victim = old[eviction.workload]
        if len(_pools_of(before, victim)) > 1:
            # A gang with tasks in several pools is evicted whole, wherever it is taken.
            continue
        assert _pools_of(before, victim) <= _pools_of(after, by), eviction
    # No queue is pushed over its limit in any pool.
    used_before, used_after = _pool_usage(before), _pool_usage(after)
    for queue in before.queues:
        for pool in {node.pool for node in before.nodes}:
            limit = queue.quota_in(pool).limit.gpu
            key = (queue.name, pool)
            if used_before.get(key, 0.0) <= limit + TOLERANCE:
                assert used_after.get(key, 0.0) <= limit + TOLERANCE, (key, limit)


@CYCLE
@given(pooled_cases())
def test_work_refused_at_submit_for_its_pools_never_starts(case: Case) -> None:
    # The server's never-fits check (engine.admission) must not refuse what a cycle would
    # start: a workload that lists pools is judged on each pool's nodes and limits.
    snapshot = case.snapshot
    note(f"snapshot = {python_code(snapshot)}")
    decisions = schedule(snapshot, case.config)
    for workload in snapshot.workloads:
        if workload.placements or not workload.node_pools:
            continue
        spec = WorkloadSpec(
            workload.name,
            workload.queue,
            "u",
            workload.task_groups,
            min_available=workload.min_available,
            node_selector=workload.node_selector,
            node_pools=workload.node_pools,
        )
        problem = never_fits(spec, snapshot.nodes, snapshot.queues)
        if problem is not None:
            assert workload.name not in decisions.bindings, problem
