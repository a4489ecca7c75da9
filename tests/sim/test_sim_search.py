"""The size searches of the pooling study and their early stop: the running count of late
jobs equals a full scan at every report of a real replay, a run it stops really ends
above the threshold, and the scan-then-bisect search probes the same sizes and finds the
same answer as probing the whole grid first, minus the sizes above the first pass."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.sim import (
    Cluster,
    SimSettings,
    Simulation,
    prepare,
    project_queues,
    synthetic_trace,
    uniform_nodes,
)
from corral.sim.search import LateCount, fewest_passing, late_limit

HOUR = 3600.0


def replay(gpus: int, policy: str) -> Simulation:
    trace = synthetic_trace(seed=3, hours=24)
    quotas = {project: 8.0 for project in trace.projects}
    cluster = Cluster("c", uniform_nodes(gpus, 8), project_queues(quotas))
    return Simulation(prepare(policy, cluster), trace, cluster.quotas(), SimSettings())


def full_scan(simulation: Simulation, now: float, threshold: float) -> int:
    """The count the pooling study used to make at each report: every settled job."""
    late = 0
    for state in simulation.jobs:
        if state.job.submitted > now - threshold:
            break
        started = now if math.isnan(state.first_start) else state.first_start
        late += started - state.job.submitted > threshold
    return late


@pytest.mark.parametrize(("gpus", "policy"), [(16, "fifo"), (16, "corral"), (24, "static")])
def test_late_count_is_a_full_scan_and_its_stop_is_right(gpus: int, policy: str) -> None:
    """A cluster too small for the load: many jobs wait hours. At every report the running
    count equals the full scan; and where it passes the limit, the finished run's p95 is
    above the threshold (the stop is exact)."""
    simulation = replay(gpus, policy)
    threshold = 1 * HOUR
    late = LateCount(simulation.jobs, threshold)
    seen: list[tuple[int, int]] = []

    def check(now: float) -> None:
        seen.append((late.advance(now), full_scan(simulation, now, threshold)))

    result = simulation.run(check)
    assert len(seen) > 50
    assert all(ours == theirs for ours, theirs in seen)
    assert seen[-1][0] > 0, "the cluster should be too small: some jobs wait an hour"
    limit = late_limit(len(simulation.jobs))
    if any(ours > limit for ours, _ in seen):
        assert (result.queueing_delay.p95 or 0) > threshold


def test_late_count_passing_the_limit_settles_the_p95() -> None:
    """Where the count passes the limit during the run, the p95 is above the threshold;
    at the same size with a threshold the run meets, the count never passes it."""
    simulation = replay(8, "fifo")
    threshold = 0.5 * HOUR
    late = LateCount(simulation.jobs, threshold)
    counts: list[int] = []
    result = simulation.run(lambda now: counts.append(late.advance(now)))
    assert max(counts) > late_limit(len(simulation.jobs))
    assert (result.queueing_delay.p95 or 0) > threshold
    p95 = result.queueing_delay.p95 or 0
    again = replay(8, "fifo")
    relaxed = LateCount(again.jobs, p95 + 1)
    highest = 0

    def watch(now: float) -> None:
        nonlocal highest
        highest = max(highest, relaxed.advance(now))

    again.run(watch)
    assert highest <= late_limit(len(again.jobs))


def test_late_count_refuses_a_clock_going_back() -> None:
    late = LateCount(replay(8, "fifo").jobs, HOUR)
    late.advance(100.0)
    with pytest.raises(ValueError, match="went back"):
        late.advance(50.0)


def grid_then_bisect(
    grid: list[int], passes: dict[int, bool], resolution: int
) -> tuple[int | None, set[int]]:
    """The search as the study ran it before: every grid size, then bisection."""
    probed = set(grid)
    passing = [size for size in sorted(grid) if passes[size]]
    if not passing:
        return None, probed
    high = passing[0]
    low = max((size for size in grid if size < high), default=0)
    while high - low > resolution:
        middle = (low + high) // 2 // resolution * resolution
        if middle <= low:
            break
        probed.add(middle)
        if passes[middle]:
            high = middle
        else:
            low = middle
    return high, probed


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), monotone=st.booleans())
def test_fewest_passing_finds_what_the_whole_grid_found(seed: int, monotone: bool) -> None:
    """For any pass/fail pattern (monotone in size or not), the same answer and the same
    bisection probes as probing the whole grid first; no grid size above the first pass."""
    rng = random.Random(seed)
    resolution = rng.choice((8, 16))
    step = resolution * rng.randint(3, 30)
    grid = [step * k for k in range(1, rng.randint(2, 8))]
    cut = rng.randint(0, grid[-1] + step)
    sizes = range(0, grid[-1] + 1, 8)
    passes = {size: size >= cut if monotone else rng.random() < 0.5 for size in (*sizes, *grid)}
    probed: list[int] = []

    def probe(size: int) -> tuple[bool, str]:
        probed.append(size)
        return passes[size], f"run at {size}"

    fewest, best, probes = fewest_passing(grid, probe, resolution)
    expected, expected_probes = grid_then_bisect(grid, passes, resolution)
    assert fewest == expected
    assert best == (None if fewest is None else f"run at {fewest}")
    assert len(probed) == len(set(probed)), "no size probed twice"
    first_pass = next((size for size in grid if passes[size]), None)
    skipped = {size for size in grid if first_pass is not None and size > first_pass}
    assert set(probed) == expected_probes - skipped
    assert set(probes) == set(probed)
    if monotone:
        # Then it is the fewest passing multiple of the resolution.
        smallest = max(resolution, math.ceil(cut / resolution) * resolution)
        assert fewest == (smallest if cut <= grid[-1] else None)


def test_fewest_passing_reuses_known_runs_and_reports_none() -> None:
    probed: list[int] = []

    def probe(size: int) -> tuple[bool, int]:
        probed.append(size)
        return size >= 100, size

    known = {64: (False, 64), 128: (True, 128)}
    fewest, best, probes = fewest_passing([64, 128, 192], probe, 16, known)
    assert (fewest, best) == (112, 112)
    assert 64 not in probed and 128 not in probed and 192 not in probed
    assert set(probes) == {64, 128, *probed}
    assert fewest_passing([8, 16], lambda size: (False, size), 8) == (
        None,
        None,
        {8: (False, 8), 16: (False, 16)},
    )
