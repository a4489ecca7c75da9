"""Invariants of one scheduling cycle on random clusters, queue trees and workloads.

Each test draws a valid snapshot with a consistent running state (see strategies.py),
runs `schedule`, applies the decisions and checks one invariant.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from strategies import (
    TOLERANCE,
    Case,
    cases,
    changed_quotas,
    churn_cases,
    gang_problems,
    leaves,
    physical_problems,
    python_code,
    queue_paths,
    selector_matches,
    workload_batch,
)

from corral.engine import Claim, Scheduler, apply_decisions, divide, schedule
from corral.engine.ordering import FairOrder
from corral.model import (
    GIB,
    Decisions,
    Node,
    Placement,
    Queue,
    Resources,
    SchedulerConfig,
    Snapshot,
    TaskGroup,
    Topology,
    Workload,
)

# Minutes of work: started before the other modules (tests/conftest.py).
pytestmark = pytest.mark.long

# Raise for a longer hunt: CORRAL_PROPERTY_EXAMPLES=2000 pytest tests/property
EXAMPLES = int(os.environ.get("CORRAL_PROPERTY_EXAMPLES", "50"))
CYCLE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Usage = dict[str, list[float]]

# The tests about evictions draw only the cases where evictions are likely.
evicting_cases = st.one_of(cases("pressure"), cases("fragmented"))


def run(case: Case) -> tuple[Decisions, Snapshot]:
    note(f"snapshot = {python_code(case.snapshot)}")
    note(f"config = {python_code(case.config)}  # origin: {case.origin}")
    decisions = schedule(case.snapshot, case.config)
    note(f"bindings: {dict(decisions.bindings)}")
    note(f"evictions: {decisions.evictions}")
    return decisions, apply_decisions(case.snapshot, decisions)


def by_name(snapshot: Snapshot) -> dict[str, Workload]:
    return {workload.name: workload for workload in snapshot.workloads}


def usage(snapshot: Snapshot, non_preemptible_only: bool = False) -> Usage:
    """GPU, CPU and memory of the running tasks of each queue, ancestors included."""
    paths = queue_paths(snapshot.queues)
    totals = {queue.name: [0.0, 0.0, 0.0] for queue in snapshot.queues}
    for workload in snapshot.workloads:
        if non_preemptible_only and workload.preemptible:
            continue
        for placement in workload.placements:
            group = workload.task_group_of(placement.task)
            for name in paths[workload.queue]:
                totals[name][0] += placement.gpu
                totals[name][1] += group.cpu
                totals[name][2] += group.memory
    return totals


def caps(snapshot: Snapshot, field: str) -> dict[str, list[float]]:
    result = {}
    for queue in snapshot.queues:
        amounts = getattr(queue, field)
        result[queue.name] = [amounts.gpu, amounts.cpu, amounts.memory]
    return result


def newly_bound(before: Snapshot, decisions: Decisions) -> dict[str, Workload]:
    """Workloads that were pending before the cycle and got bindings."""
    old = by_name(before)
    return {name: old[name] for name in decisions.bindings if not old[name].placements}


def assert_within(before: Usage, after: Usage, cap: Mapping[str, list[float]], what: str) -> None:
    for name, amounts in cap.items():
        for resource, limit in enumerate(amounts):
            if before[name][resource] <= limit + TOLERANCE:
                assert after[name][resource] <= limit + TOLERANCE, (
                    f"queue {name} {('gpu', 'cpu', 'memory')[resource]}: "
                    f"{before[name][resource]:g} -> {after[name][resource]:g}, {what} {limit:g}"
                )


# Regression examples: minimal cases Hypothesis found, each of which an earlier engine got
# wrong as its comment says. -------------------------------------------------------------

GPU = Resources(1.0, math.inf, math.inf)

# Two tasks of one victim share a device; the victim was evicted to make room for 0.1 GPU,
# then put back because each task, checked alone, still fitted beside the newcomer: the
# device held 1.1 GPUs.
SHARED_DEVICE_VICTIM_PUT_BACK = Case(
    Snapshot(
        nodes=(Node(name="node0", gpus=1),),
        queues=(Queue(name="p0", deserved=GPU), Queue(name="p1")),
        workloads=(
            Workload(
                name="lender",
                queue="p1",
                task_groups=(TaskGroup(replicas=2, gpu=0.5),),
                placements=(Placement(0, "node0", (0,), 0.5), Placement(1, "node0", (0,), 0.5)),
            ),
            Workload(name="owner", queue="p0", task_groups=(TaskGroup(gpu=0.1),), submitted=1.0),
        ),
    ),
    SchedulerConfig(),
    "regression",
)

# The same with CPU: each of the victim's tasks alone fits in the CPU left, both do not;
# the node ran 9 of its 8 cores.
SHARED_CPU_VICTIM_PUT_BACK = Case(
    Snapshot(
        nodes=(Node(name="node0", gpus=2, cpu=8.0),),
        queues=(Queue(name="p0"),),
        workloads=(
            Workload(
                name="low",
                queue="p0",
                task_groups=(TaskGroup(replicas=2, gpu=0.25, cpu=4.0),),
                placements=(Placement(0, "node0", (0,), 0.25), Placement(1, "node0", (0,), 0.25)),
            ),
            Workload(
                name="high",
                queue="p0",
                task_groups=(TaskGroup(gpu=0.25, cpu=1.0),),
                priority=75,
                submitted=1.0,
            ),
        ),
    ),
    SchedulerConfig(),
    "regression",
)

# The queue is at its limit; preempting "low" makes room within the limit, "high" lands
# on the other node, and "low" was put back because its device was still free: the queue
# ran 2 GPUs against a limit of 1.
PREEMPT_VICTIM_PUT_BACK_OVER_LIMIT = Case(
    Snapshot(
        nodes=(Node(name="node0", gpus=1), Node(name="node1", gpus=1)),
        queues=(Queue(name="p0", deserved=GPU, limit=GPU),),
        workloads=(
            Workload(
                name="low",
                queue="p0",
                task_groups=(TaskGroup(gpu=1.0),),
                placements=(Placement(0, "node1", (0,), 1.0),),
            ),
            Workload(
                name="high",
                queue="p0",
                task_groups=(TaskGroup(gpu=1.0),),
                priority=75,
                submitted=1.0,
            ),
        ),
    ),
    SchedulerConfig(),
    "regression",
)

# Preempt takes the elastic extra task 2, then the minimum gang (tasks 0 and 1); the
# extra task was put back since its device was still free, and ran alone below
# min_available.
ELASTIC_EXTRA_PUT_BACK_WITHOUT_ITS_GANG = Case(
    Snapshot(
        nodes=(Node(name="node0", gpus=2),),
        queues=(Queue(name="p0"),),
        workloads=(
            Workload(
                name="elastic",
                queue="p0",
                task_groups=(TaskGroup(replicas=3, gpu=0.4),),
                min_available=2,
                placements=(
                    Placement(0, "node0", (0,), 0.4),
                    Placement(1, "node0", (1,), 0.4),
                    Placement(2, "node0", (1,), 0.4),
                ),
            ),
            Workload(
                name="high",
                queue="p0",
                task_groups=(TaskGroup(gpu=1.0),),
                priority=75,
                submitted=1.0,
            ),
        ),
    ),
    SchedulerConfig(),
    "regression",
)


# A memory-sized fraction counts 0.5 GPU nominally (40GiB of the largest, 80GiB device)
# but takes a whole 40GiB device on node1. Allocate checks the real amount and refuses;
# consolidate checked only the nominal one and bound it: the queue ran 1 GPU against a
# limit of 0.5 (or, non-preemptible, against 0.5 deserved).
def memory_fraction_case(queue: Queue, preemptible: bool) -> Case:
    return Case(
        Snapshot(
            nodes=(
                Node(name="node0", gpus=1, gpu_memory=80 * GIB),
                Node(name="node1", gpus=1, gpu_memory=40 * GIB),
            ),
            queues=(queue, Queue(name="p1")),
            workloads=(
                Workload(
                    name="other",
                    queue="p1",
                    task_groups=(TaskGroup(gpu=1.0),),
                    placements=(Placement(0, "node0", (0,), 1.0),),
                ),
                Workload(
                    name="by-memory",
                    queue="p0",
                    task_groups=(TaskGroup(gpu_memory=40 * GIB),),
                    priority=50 if preemptible else 100,
                    preemptible=preemptible,
                    submitted=1.0,
                ),
            ),
        ),
        SchedulerConfig(),
        "regression",
    )


HALF = Resources(0.5, math.inf, math.inf)
CONSOLIDATE_MEMORY_FRACTION_OVER_LIMIT = memory_fraction_case(Queue(name="p0", limit=HALF), True)
CONSOLIDATE_MEMORY_FRACTION_OVER_DESERVED = memory_fraction_case(
    Queue(name="p0", deserved=HALF), False
)

# Consolidation moved "mover" (40GiB of GPU memory, 0.5 of node0's 80GiB device) to
# node1, whose 40GiB device it takes whole: its queue p1 went from 0.5 to 1 GPU against
# a limit of 0.5.
CONSOLIDATE_MOVES_MEMORY_FRACTION_OVER_LIMIT = Case(
    Snapshot(
        nodes=(
            Node(name="node0", gpus=1, gpu_memory=80 * GIB, gpu_model="A"),
            Node(name="node1", gpus=1, gpu_memory=40 * GIB, gpu_model="B"),
        ),
        queues=(Queue(name="p0"), Queue(name="p1", limit=HALF)),
        workloads=(
            Workload(
                name="mover",
                queue="p1",
                task_groups=(TaskGroup(gpu_memory=40 * GIB),),
                placements=(Placement(0, "node0", (0,), 0.5),),
            ),
            Workload(
                name="pending",
                queue="p0",
                task_groups=(TaskGroup(gpu=1.0),),
                node_selector={"gpu_model": ("A",)},
                submitted=1.0,
            ),
        ),
    ),
    SchedulerConfig(),
    "regression",
)

RACKS = (
    Node(name="node0", gpus=1, labels={"rack": "r1"}),
    Node(name="node1", gpus=1, labels={"rack": "r2"}),
)
ELASTIC_IN_ONE_RACK = Workload(
    name="elastic",
    queue="p0",
    task_groups=(TaskGroup(replicas=2, gpu=1.0),),
    min_available=1,
    topology=Topology("rack", required=True),
)

# An elastic workload with a required rack: its minimum gang started in r1 and its growth
# task in r2, in the same cycle.
ELASTIC_GROWS_OUT_OF_ITS_RACK = Case(
    Snapshot(RACKS, (Queue(name="p0"),), (ELASTIC_IN_ONE_RACK,)),
    SchedulerConfig(actions=("allocate",)),
    "regression",
)

# The same when the workload already runs in r1 and grows in a later cycle.
RUNNING_ELASTIC_GROWS_OUT_OF_ITS_RACK = Case(
    Snapshot(
        RACKS,
        (Queue(name="p0"),),
        (replace(ELASTIC_IN_ONE_RACK, placements=(Placement(0, "node0", (0,), 1.0),)),),
    ),
    SchedulerConfig(actions=("allocate",)),
    "regression",
)


# Issue 41: p1's gang cannot be placed, so p0's pending job took the free GPU first; then
# p1's quarter-GPU job reclaimed p0's running job. p0 held one GPU before and after: the
# eviction only swapped its jobs, where the quarter could have had the free GPU.
FRACTION_BEHIND_BLOCKED_GANG = Case(
    Snapshot(
        nodes=(Node(name="node0", gpus=2),),
        queues=(Queue(name="p0", deserved=GPU), Queue(name="p1", deserved=GPU)),
        workloads=(
            Workload(
                name="w0",
                queue="p0",
                task_groups=(TaskGroup(gpu=1.0),),
                placements=(Placement(0, "node0", (0,), 1.0),),
            ),
            Workload(
                name="w1", queue="p1", task_groups=(TaskGroup(replicas=2, gpu=1.0),), submitted=1.0
            ),
            Workload(name="w2", queue="p1", task_groups=(TaskGroup(gpu=0.25),), submitted=2.0),
            Workload(name="w3", queue="p0", task_groups=(TaskGroup(gpu=1.0),), submitted=3.0),
        ),
    ),
    SchedulerConfig(),
    "regression",
)


# 1 -------------------------------------------------------------------------------------


@example(SHARED_DEVICE_VICTIM_PUT_BACK)
@example(SHARED_CPU_VICTIM_PUT_BACK)
@CYCLE
@given(cases())
def test_no_device_over_committed(case: Case) -> None:
    assert physical_problems(case.snapshot) == []
    _, after = run(case)
    assert physical_problems(after) == []


@CYCLE
@given(st.one_of(cases(), evicting_cases))
def test_applied_decisions_change_only_the_workloads_decided(case: Case) -> None:
    """apply_decisions keeps every workload no decision names as it was, the same object
    in the same place (the kept state of a Scheduler knows its work by identity), and
    gives each one named its placements less the evicted tasks and plus the bound ones."""
    decisions, after = run(case)
    evicted: dict[str, set[int]] = {}
    for eviction in decisions.evictions:
        evicted.setdefault(eviction.workload, set()).update(eviction.tasks)
    assert len(after.workloads) == len(case.snapshot.workloads)
    for old, new in zip(case.snapshot.workloads, after.workloads, strict=True):
        gone, started = evicted.get(old.name, set()), decisions.bindings.get(old.name, ())
        if not gone and not started:
            assert new is old
            continue
        kept = [p for p in old.placements if p.task not in gone]
        assert new.placements == tuple(sorted([*kept, *started], key=lambda p: p.task))
        assert new.running_for == (0.0 if started and not kept else old.running_for)
        assert replace(new, placements=old.placements, running_for=old.running_for) == replace(
            old, since_checkpoint=new.since_checkpoint
        )


# 2 -------------------------------------------------------------------------------------


@example(PREEMPT_VICTIM_PUT_BACK_OVER_LIMIT)
@example(CONSOLIDATE_MEMORY_FRACTION_OVER_LIMIT)
@example(CONSOLIDATE_MOVES_MEMORY_FRACTION_OVER_LIMIT)
@CYCLE
@given(cases())
def test_no_queue_pushed_over_its_limit(case: Case) -> None:
    _, after = run(case)
    limits = caps(case.snapshot, "limit")
    assert_within(usage(case.snapshot), usage(after), limits, "limit")


# 3 -------------------------------------------------------------------------------------


@example(CONSOLIDATE_MEMORY_FRACTION_OVER_DESERVED)
@CYCLE
@given(cases())
def test_non_preemptible_work_stays_within_deserved(case: Case) -> None:
    _, after = run(case)
    deserved = caps(case.snapshot, "deserved")
    assert_within(usage(case.snapshot, True), usage(after, True), deserved, "deserved")


# 4 -------------------------------------------------------------------------------------


@example(ELASTIC_EXTRA_PUT_BACK_WITHOUT_ITS_GANG)
@CYCLE
@given(cases())
def test_gangs_all_or_nothing(case: Case) -> None:
    assert gang_problems(case.snapshot) == []
    decisions, after = run(case)
    assert gang_problems(after) == []
    old = by_name(case.snapshot)
    evicted: dict[str, set[int]] = {}
    for eviction in decisions.evictions:
        assert set(eviction.tasks) <= {p.task for p in old[eviction.workload].placements}
        evicted.setdefault(eviction.workload, set()).update(eviction.tasks)
    for name, placements in decisions.bindings.items():
        tasks = [placement.task for placement in placements]
        assert len(set(tasks)) == len(tasks), f"{name} binds {tasks}"
        running = {p.task for p in old[name].placements} - evicted.get(name, set())
        assert not running & set(tasks), f"{name} binds running tasks {running & set(tasks)}"
    for name, workload in newly_bound(case.snapshot, decisions).items():
        assert len(decisions.bindings[name]) >= workload.min_tasks


# 5 -------------------------------------------------------------------------------------


@CYCLE
@given(cases(), st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_listing_order(case: Case, rng: random.Random) -> None:
    first = schedule(case.snapshot, case.config)
    assert schedule(case.snapshot, case.config) == first
    nodes = list(case.snapshot.nodes)
    workloads = list(case.snapshot.workloads)
    rng.shuffle(nodes)
    rng.shuffle(workloads)
    shuffled = Snapshot(tuple(nodes), case.snapshot.queues, tuple(workloads))
    note(f"nodes {[node.name for node in nodes]}, workloads {[w.name for w in workloads]}")
    assert schedule(shuffled, case.config) == first


@st.composite
def with_backlogs(draw: st.DrawFn) -> Case:
    """A case whose pending workloads come with alike copies (the same tasks, priority
    and constraints, submitted a moment later): backlogs of alike work, as users submit
    them, that the engine tries once per kind while nothing changes."""
    case = draw(cases())
    copies = []
    for workload in case.snapshot.workloads:
        if workload.placements:
            continue
        for copy in range(draw(st.integers(0, 3))):
            later = workload.submitted + (copy + 1) * 1e-3
            copies.append(replace(workload, name=f"{workload.name}-{copy}", submitted=later))
    snapshot = replace(case.snapshot, workloads=(*case.snapshot.workloads, *copies))
    return Case(snapshot, case.config, case.origin)


@CYCLE
@given(with_backlogs())
def test_alike_work_is_decided_as_if_each_were_tried(case: Case) -> None:
    """Taking the reason of the alike candidate before it decides exactly what trying
    each one in turn decides: bindings, evictions, pending reasons, queue totals."""
    batched = schedule(case.snapshot, case.config)
    take_alike = FairOrder.take_alike
    # Nothing is alike: every candidate is tried.
    FairOrder.take_alike = lambda self, failed: iter(())  # type: ignore[method-assign]
    try:
        one_by_one = schedule(case.snapshot, case.config)
    finally:
        FairOrder.take_alike = take_alike  # type: ignore[method-assign]
    assert batched == one_by_one


@CYCLE
@given(cases(), st.data())
def test_a_scheduler_that_keeps_its_state_decides_as_schedule_does(
    case: Case, data: st.DataObject
) -> None:
    """Cycle after cycle, as between cycles of a server or a simulation: decisions are
    applied (or, now and then, not), running work ends, new work arrives, the queues'
    usage moves (it weighs in where time-decayed fair share is on), and once in a while
    quotas change or a node is cordoned (the state is then built afresh)."""
    scheduler = Scheduler()
    snapshot = case.snapshot
    names_of_queues = [queue.name for queue in snapshot.queues]
    if data.draw(st.booleans(), label="time-decayed fair share"):
        decayed = tuple(replace(queue, fair_share_half_life=3600.0) for queue in snapshot.queues)
        snapshot = replace(snapshot, queues=decayed)
    leaf_names = leaves(snapshot.queues)
    max_gpus = max(node.gpus for node in snapshot.nodes)
    for step in range(1, 5):
        note(f"cycle {step}: {python_code(snapshot)}")
        decisions = scheduler(snapshot, case.config)
        assert decisions == schedule(snapshot, case.config)
        # What the kept state counts as it goes, against a count of its workloads.
        kept = scheduler._kept
        assert kept is not None
        elastic = [ws for ws in kept.workloads.values() if ws.running and ws.workload.elastic]
        assert kept.state.elastic_running == len(elastic)
        if data.draw(st.integers(0, 4), label="apply"):
            snapshot = apply_decisions(snapshot, decisions)
        names = [w.name for w in snapshot.workloads]
        ended = data.draw(st.sets(st.sampled_from(names))) if names else set()
        arrived = data.draw(
            workload_batch(100 * step, data.draw(st.integers(0, 3)), leaf_names, max_gpus, True)
        )
        workloads = (*(w for w in snapshot.workloads if w.name not in ended), *arrived)
        # A store gives some workloads again as equal new objects (read again), and a
        # caller may list them in another order.
        again = data.draw(st.sets(st.sampled_from(names))) if names else set()
        workloads = tuple(replace(w) if w.name in again else w for w in workloads)
        if data.draw(st.integers(0, 4), label="listing order") == 0:
            workloads = tuple(data.draw(st.permutations(workloads)))
        snapshot = replace(snapshot, workloads=workloads)
        if data.draw(st.booleans(), label="usage moves"):
            shares = st.floats(0.0, 1.0, allow_subnormal=False)
            used = data.draw(st.dictionaries(st.sampled_from(names_of_queues), shares))
            snapshot = replace(snapshot, usage=used)
        change = data.draw(st.integers(0, 9), label="change")
        if change == 0:
            snapshot = replace(snapshot, queues=data.draw(changed_quotas(snapshot.queues)))
        elif change == 1:
            cordoned = replace(snapshot.nodes[0], schedulable=not snapshot.nodes[0].schedulable)
            snapshot = replace(snapshot, nodes=(cordoned, *snapshot.nodes[1:]))


# 6 -------------------------------------------------------------------------------------


@CYCLE
@given(evicting_cases)
def test_no_eviction_without_placing_the_workload_it_is_for(case: Case) -> None:
    decisions, after = run(case)
    now = by_name(after)
    for eviction in decisions.evictions:
        assert eviction.action in ("reclaim", "preempt", "consolidate"), eviction
        assert eviction.by is not None and eviction.by in decisions.bindings, eviction
        assert now[eviction.by].placements, eviction
        if eviction.action == "consolidate":
            # A move: the workload is placed again, every task it had.
            moved = {placement.task for placement in decisions.bindings.get(eviction.workload, ())}
            assert set(eviction.tasks) <= moved, eviction


# 7 -------------------------------------------------------------------------------------


@CYCLE
@given(evicting_cases)
def test_non_preemptible_never_evicted(case: Case) -> None:
    decisions, _ = run(case)
    old = by_name(case.snapshot)
    for eviction in decisions.evictions:
        assert old[eviction.workload].preemptible, eviction


# 8 -------------------------------------------------------------------------------------


@CYCLE
@given(cases())
def test_pending_reason_exactly_for_workloads_not_running(case: Case) -> None:
    decisions, after = run(case)
    for workload in after.workloads:
        if workload.placements:
            assert workload.name not in decisions.pending, workload.name
        else:
            reason = decisions.pending.get(workload.name)
            assert isinstance(reason, str) and reason.strip(), workload.name
    assert set(decisions.pending) <= {workload.name for workload in after.workloads}


# 9 -------------------------------------------------------------------------------------


def domains(snapshot: Snapshot, key: str, placements: Sequence[Placement]) -> set[str | None]:
    nodes = {node.name: node for node in snapshot.nodes}
    return {nodes[placement.node].label(key) for placement in placements}


@example(ELASTIC_GROWS_OUT_OF_ITS_RACK)
@CYCLE
@given(cases())
def test_required_topology_keeps_a_new_workload_in_one_domain(case: Case) -> None:
    decisions, _ = run(case)
    for name, workload in newly_bound(case.snapshot, decisions).items():
        if workload.topology is not None and workload.topology.required:
            found = domains(case.snapshot, workload.topology.key, decisions.bindings[name])
            assert len(found) == 1 and None not in found, (name, found)


@example(RUNNING_ELASTIC_GROWS_OUT_OF_ITS_RACK)
@CYCLE
@given(cases())
def test_required_topology_holds_after_growth_and_moves(case: Case) -> None:
    _, after = run(case)
    old = by_name(case.snapshot)
    for workload in after.workloads:
        topology = workload.topology
        if topology is None or not topology.required or not workload.placements:
            continue
        if len(domains(case.snapshot, topology.key, old[workload.name].placements)) > 1:
            continue
        found = domains(after, topology.key, workload.placements)
        assert len(found) == 1 and None not in found, (workload.name, found)


# 10 ------------------------------------------------------------------------------------


@CYCLE
@given(cases())
def test_node_selectors_respected_by_new_bindings(case: Case) -> None:
    decisions, _ = run(case)
    nodes = {node.name: node for node in case.snapshot.nodes}
    old = by_name(case.snapshot)
    for name, placements in decisions.bindings.items():
        selector = old[name].node_selector
        for placement in placements:
            assert selector_matches(nodes[placement.node], selector), (name, placement)


@CYCLE
@given(cases())
def test_nothing_new_lands_on_a_cordoned_node(case: Case) -> None:
    decisions, _ = run(case)
    cordoned = {node.name for node in case.snapshot.nodes if not node.schedulable}
    for name, placements in decisions.bindings.items():
        for placement in placements:
            assert placement.node not in cordoned, (name, placement)


# 11 ------------------------------------------------------------------------------------


@st.composite
def claim_lists(draw: st.DrawFn) -> list[Claim]:
    claims = []
    for _ in range(draw(st.integers(1, 6))):
        deserved = draw(st.sampled_from((0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 8.0, math.inf)))
        extra = draw(st.sampled_from((0.0, 0.5, 1.0, 3.0, math.inf)))
        claims.append(
            Claim(
                deserved=deserved,
                demand=draw(st.floats(0, 20, allow_nan=False).map(lambda x: round(x, 2))),
                limit=deserved + extra,
                weight=draw(st.sampled_from((0.0, 0.5, 1.0, 2.0, 3.0))),
                priority=draw(st.sampled_from((50, 100, 100, 150))),
            )
        )
    return claims


amounts = st.floats(0, 40, allow_nan=False).map(lambda x: round(x, 2))
DIVIDE = settings(max_examples=200, deadline=None)


def base(claim: Claim) -> float:
    return min(claim.deserved, claim.demand, claim.limit)


@DIVIDE
@given(amounts, claim_lists())
def test_divide_bounds(amount: float, claims: list[Claim]) -> None:
    shares = divide(amount, claims)
    assert len(shares) == len(claims)
    leftover = max(0.0, amount - sum(base(claim) for claim in claims))
    beyond = 0.0
    for claim, share in zip(claims, shares, strict=True):
        assert share >= base(claim) - TOLERANCE, (claim, share)
        assert share <= min(claim.demand, claim.limit) + TOLERANCE, (claim, share)
        if claim.weight == 0:
            assert abs(share - base(claim)) <= TOLERANCE, (claim, share)
        beyond += share - base(claim)
    assert beyond <= leftover + TOLERANCE


@DIVIDE
@given(amounts, claim_lists())
def test_divide_gives_away_the_whole_leftover_that_is_wanted(
    amount: float, claims: list[Claim]
) -> None:
    shares = divide(amount, claims)
    leftover = max(0.0, amount - sum(base(claim) for claim in claims))
    wanted = sum(
        min(claim.demand, claim.limit) - base(claim) for claim in claims if claim.weight > 0
    )
    given_away = sum(share - base(claim) for claim, share in zip(claims, shares, strict=True))
    assert abs(given_away - min(leftover, wanted)) <= 1e-4


@DIVIDE
@given(amounts, claim_lists(), st.data())
def test_divide_monotonic_in_weight(
    amount: float, claims: list[Claim], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(claims) - 1))
    raise_by = data.draw(st.sampled_from((0.5, 1.0, 2.0)))
    before = divide(amount, claims)[index]
    heavier = list(claims)
    claim = claims[index]
    heavier[index] = Claim(
        claim.deserved, claim.demand, claim.limit, claim.weight + raise_by, claim.priority
    )
    after = divide(amount, heavier)[index]
    assert after >= before - TOLERANCE, (before, after)


# 12 ------------------------------------------------------------------------------------


@CYCLE
@given(evicting_cases)
def test_preempt_and_reclaim_victims(case: Case) -> None:
    decisions, _ = run(case)
    old = by_name(case.snapshot)
    for eviction in decisions.evictions:
        victim = old[eviction.workload]
        by = old[eviction.by] if eviction.by is not None else None
        assert by is not None, eviction
        if eviction.action == "preempt":
            assert victim.queue == by.queue, eviction
            assert victim.priority < by.priority, eviction
        elif eviction.action == "reclaim":
            assert victim.queue != by.queue, eviction


# Extra: the queue totals the engine reports agree with the state it leaves behind.


@CYCLE
@given(cases())
def test_reported_allocation_matches_the_state_after(case: Case) -> None:
    decisions, after = run(case)
    totals = usage(after)
    for name, status in decisions.queues.items():
        reported = [status.allocated.gpu, status.allocated.cpu, status.allocated.memory]
        for resource in range(3):
            assert abs(reported[resource] - totals[name][resource]) <= 1e-3, (name, reported)


# No churn ------------------------------------------------------------------------------


def allocation_by_priority(snapshot: Snapshot) -> dict[tuple[str, int], float]:
    """GPUs running per leaf queue and workload priority (zero entries left out)."""
    totals: dict[tuple[str, int], float] = {}
    for workload in snapshot.workloads:
        gpus = sum(placement.gpu for placement in workload.placements)
        if gpus > TOLERANCE:
            key = (workload.queue, workload.priority)
            totals[key] = totals.get(key, 0.0) + gpus
    return totals


@CYCLE
@given(evicting_cases)
def test_evictions_change_who_gets_gpus(case: Case) -> None:
    # A cycle that evicts must change some queue's GPUs at some workload priority: never
    # one workload of a queue evicted for another of the same queue and priority alike.
    decisions, after = run(case)
    if not any(eviction.action != "consolidate" for eviction in decisions.evictions):
        return
    before = allocation_by_priority(case.snapshot)
    now = allocation_by_priority(after)
    keys = set(before) | set(now)
    assert any(abs(before.get(key, 0.0) - now.get(key, 0.0)) > TOLERANCE for key in keys), (
        before,
        now,
    )


def without_evictions(case: Case, decisions: Decisions) -> Snapshot:
    """What the cycle could have had without evicting: the snapshot before it, with only
    the workloads the cycle started pending, after a cycle that only allocates."""
    started = set(newly_bound(case.snapshot, decisions))
    workloads = tuple(
        workload
        for workload in case.snapshot.workloads
        if workload.placements or workload.name in started
    )
    snapshot = replace(case.snapshot, workloads=workloads)
    config = replace(case.config, actions=("allocate",))
    return apply_decisions(snapshot, schedule(snapshot, config))


def holdings(snapshot: Snapshot) -> dict[tuple[str, int], list[float]]:
    """GPU, CPU, memory and tasks running per leaf queue and workload priority."""
    totals: dict[tuple[str, int], list[float]] = {}
    for workload in snapshot.workloads:
        for placement in workload.placements:
            group = workload.task_group_of(placement.task)
            held = totals.setdefault((workload.queue, workload.priority), [0.0] * 4)
            for index, amount in enumerate((placement.gpu, group.cpu, group.memory, 1)):
                held[index] += amount
    return totals


def assert_evictions_needed(case: Case) -> None:
    """A cycle that evicts must give some queue at some workload priority more (of a
    resource, or tasks running) than it could have had without evicting anything: else
    the evictions only lost work, as when the room they freed went back to their victims'
    own queue, or the work they were for could have shared room that was free."""
    decisions, after = run(case)
    if not any(eviction.action != "consolidate" for eviction in decisions.evictions):
        return
    now = holdings(after)
    instead = holdings(without_evictions(case, decisions))
    note(f"without evicting: {instead}")
    nothing = [0.0] * 4
    assert any(
        amount > other + TOLERANCE
        for key, held in now.items()
        for amount, other in zip(held, instead.get(key, nothing), strict=True)
    ), (now, instead)


@example(FRACTION_BEHIND_BLOCKED_GANG)
@CYCLE
@given(churn_cases())
def test_evictions_are_needed_with_fractions_and_blocked_gangs(case: Case) -> None:
    assert_evictions_needed(case)


@CYCLE
@given(evicting_cases)
def test_evictions_are_needed(case: Case) -> None:
    assert_evictions_needed(case)
