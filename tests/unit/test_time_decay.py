"""Time-decayed fair share: the usage history's arithmetic, the weights, and the cycle."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine import apply_decisions, schedule
from corral.engine.fairshare import decayed_weight
from corral.model import Node, Placement, Queue, Snapshot, TaskGroup, Workload, gpu_quota
from corral.model.usage import DecayedUsage, DecaySetting, advance, decay, decay_settings, held_for

HOUR = 3600.0


def test_decay_halves_over_one_half_life() -> None:
    assert decay(8.0, 24 * HOUR, 24 * HOUR) == pytest.approx(4.0)
    assert decay(8.0, 48 * HOUR, 24 * HOUR) == pytest.approx(2.0)
    assert decay(8.0, 0.0, 24 * HOUR) == 8.0


def test_holding_for_a_short_time_counts_almost_undecayed() -> None:
    # 2 GPUs for 10 s with a day's half-life: nearly 20 GPU-seconds.
    assert held_for(2.0, 10.0, 24 * HOUR) == pytest.approx(20.0, rel=1e-4)
    assert held_for(2.0, 0.0, 24 * HOUR) == 0.0


def test_advancing_in_steps_equals_one_step() -> None:
    # The same constant allocation over 6 hours, in one step or in 360 steps of a
    # minute, gives the same history: the server's and the simulator's cycles differ.
    once = advance(DecayedUsage(100.0, 400.0), 3.0, 8.0, 6 * HOUR, 24 * HOUR)
    stepped = DecayedUsage(100.0, 400.0)
    for _ in range(360):
        stepped = advance(stepped, 3.0, 8.0, 60.0, 24 * HOUR)
    assert stepped.gpu_seconds == pytest.approx(once.gpu_seconds)
    assert stepped.cluster_gpu_seconds == pytest.approx(once.cluster_gpu_seconds)


def test_share_tends_to_the_recent_allocation() -> None:
    # A queue that had all the cluster for a day, then a quarter of it for a week: its
    # share falls from 1 towards 0.25.
    usage = advance(DecayedUsage(), 8.0, 8.0, 24 * HOUR, 24 * HOUR)
    assert usage.share == pytest.approx(1.0)
    usage = advance(usage, 2.0, 8.0, 7 * 24 * HOUR, 24 * HOUR)
    assert 0.25 < usage.share < 0.26
    assert DecayedUsage().share == 0.0


def test_settings_are_inherited_and_k_defaults_to_one() -> None:
    queues = (
        Queue("dept", fair_share_half_life=HOUR, fair_share_k=2.0),
        Queue("a", parent="dept"),
        Queue("b", parent="dept", fair_share_k=0.5),
        Queue("other"),
        Queue("c", parent="other", fair_share_half_life=60.0),
    )
    assert decay_settings(queues) == {
        "dept": DecaySetting(HOUR, 2.0),
        "a": DecaySetting(HOUR, 2.0),
        "b": DecaySetting(HOUR, 0.5),
        "c": DecaySetting(60.0, 1.0),
    }


def test_decayed_weight_formula() -> None:
    # Weights 2 and 1 (W = 3); the first used 70% of their GPU-time.
    assert decayed_weight(2.0, 3.0, 0.7, 1.0) == pytest.approx(2 + (2 - 2.1))
    assert decayed_weight(1.0, 3.0, 0.3, 1.0) == pytest.approx(1 + (1 - 0.9))
    # Used all of it, equal weights: nothing of the surplus.
    assert decayed_weight(1.0, 2.0, 1.0, 1.0) == 0.0
    # k = 0 keeps the weight.
    assert decayed_weight(2.0, 3.0, 0.9, 0.0) == 2.0


def _cluster(weights: tuple[float, float], usage: dict[str, float]) -> Snapshot:
    queues = tuple(
        Queue(
            name,
            deserved=gpu_quota(1),
            over_quota_weight=replace(Queue("x").over_quota_weight, gpu=weight),
            fair_share_half_life=HOUR,
        )
        for name, weight in zip(("a", "b"), weights, strict=True)
    )
    workloads = tuple(
        Workload(f"{queue}{i}", queue, (TaskGroup(gpu=1),), submitted=float(i))
        for queue in ("a", "b")
        for i in range(8)
    )
    return Snapshot((Node("n", gpus=8),), queues, workloads, usage=usage)


def test_the_heavy_user_gets_less_of_the_surplus_and_its_deserved_stays() -> None:
    decisions = schedule(_cluster((1.0, 1.0), {"a": 0.9, "b": 0.1}))
    a, b = decisions.queues["a"], decisions.queues["b"]
    # Weights 1 + (1 - 1.8) = 0.2 and 1 + (1 - 0.2) = 1.8; surplus 6 -> 0.6 and 5.4.
    assert (a.weight, b.weight) == pytest.approx((0.2, 1.8))
    assert (a.fair_share.gpu, b.fair_share.gpu) == pytest.approx((1.6, 6.4))
    assert (a.usage, b.usage) == (0.9, 0.1)


def test_scaling_every_weight_changes_nothing() -> None:
    usage = {"a": 0.7, "b": 0.3}
    small = schedule(_cluster((2.0, 1.0), usage)).queues
    large = schedule(_cluster((20.0, 10.0), usage)).queues
    for name in ("a", "b"):
        assert small[name].fair_share.gpu == pytest.approx(large[name].fair_share.gpu)


def test_without_a_half_life_usage_is_ignored() -> None:
    snapshot = _cluster((1.0, 1.0), {"a": 0.9, "b": 0.1})
    off = replace(
        snapshot,
        queues=tuple(replace(queue, fair_share_half_life=None) for queue in snapshot.queues),
    )
    plain = replace(off, usage={})
    assert schedule(off) == schedule(plain)
    assert schedule(off).queues["a"].weight is None


@settings(max_examples=60, deadline=None)
@given(
    deserved=st.lists(st.integers(0, 4), min_size=3, max_size=3),
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=3, max_size=3),
    usage=st.lists(st.floats(0, 1), min_size=3, max_size=3),
    k=st.sampled_from([0.0, 0.5, 1.0, 4.0]),
    demand=st.lists(st.integers(0, 10), min_size=3, max_size=3),
)
def test_never_below_what_is_deserved(
    deserved: list[int], weights: list[float], usage: list[float], k: float, demand: list[int]
) -> None:
    names = ("a", "b", "c")
    queues = tuple(
        Queue(
            name,
            deserved=gpu_quota(d),
            over_quota_weight=replace(Queue("x").over_quota_weight, gpu=w),
            fair_share_half_life=HOUR,
            fair_share_k=k,
        )
        for name, d, w in zip(names, deserved, weights, strict=True)
    )
    workloads = tuple(
        Workload(f"{name}{i}", name, (TaskGroup(gpu=1),), submitted=float(i))
        for name, count in zip(names, demand, strict=True)
        for i in range(count)
    )
    snapshot = Snapshot(
        (Node("n", gpus=12),), queues, workloads, usage=dict(zip(names, usage, strict=True))
    )
    statuses = schedule(snapshot).queues
    for name, d, count in zip(names, deserved, demand, strict=True):
        assert statuses[name].fair_share.gpu >= min(d, count) - 1e-9
        weight = statuses[name].weight
        assert weight is not None and weight >= 0 and math.isfinite(weight)


def test_running_work_is_kept_apart_from_usage() -> None:
    # Usage changes from cycle to cycle; the snapshot after decisions keeps it.
    snapshot = _cluster((1.0, 1.0), {"a": 0.5})
    running = replace(snapshot.workloads[0], placements=(Placement(0, "n", (0,), 1.0),))
    snapshot = replace(snapshot, workloads=(running, *snapshot.workloads[1:]))
    after = apply_decisions(snapshot, schedule(snapshot))
    assert after.usage == {"a": 0.5}


def test_wide_queues_and_the_dashboard_show_the_moved_weight() -> None:
    from corral.cli.project import wide_queue_cells
    from corral.dashboard.views import weight_text

    queue: dict[str, object] = {
        "over_quota_weight": {"gpu": 2.0, "cpu": 1.0, "memory": 1.0},
        "effective_weight": 0.6,
        "priority": 100,
        "allocated": None,
    }
    assert wide_queue_cells(queue)[0] == "2 → 0.6"  # type: ignore[arg-type]
    assert weight_text(queue) == "2 → 0.6"
    queue["effective_weight"] = None
    assert wide_queue_cells(queue)[0] == "2"  # type: ignore[arg-type]
    assert weight_text(queue) == "2"
