"""Searches over cluster sizes, and the exact early stop they rely on.

`LateCount` settles, during a replay, that its p95 queueing delay is above a threshold:
a job that has waited longer than the threshold, started or not, ends with a delay above
it (a delay is first start, or the run's end, minus submission), so once more than
`0.05 n + 1` of the `n` jobs have, the 95th percentile (linear interpolation, as
`metrics.stats`) lies between two of them and is above the threshold too.

`fewest_passing` finds the fewest GPUs at which a replay passes (its p95 at most the
target): sizes of a coarse grid in ascending order until the first that passes, then
bisection in steps of `resolution` between it and the grid size below. It runs the same
replays as running the whole grid and then bisecting, minus the grid sizes above the
first passing one, which cannot change the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

R = TypeVar("R")


class _Submitted(Protocol):
    @property
    def submitted(self) -> float: ...


class JobProgress(Protocol):
    """What `LateCount` reads of a job during a replay (`Simulation.jobs` items)."""

    @property
    def job(self) -> _Submitted: ...

    @property
    def first_start(self) -> float: ...


class LateCount:
    """How many jobs have certainly waited longer than `threshold`, kept up as the clock
    advances.

    `jobs` are in submission order. A job submitted at or before `now - threshold` is
    settled at `now`: it started (its delay is fixed) or it has already waited longer
    than the threshold (its delay only grows). So each job is looked at once, when the
    clock passes its submission time plus the threshold, and the count at any `now`
    equals a full scan of the settled jobs."""

    def __init__(self, jobs: Sequence[JobProgress], threshold: float) -> None:
        self.jobs = jobs
        self.threshold = threshold
        self.late = 0
        self.settled = 0  # jobs[:settled] are counted
        self.now = -math.inf

    def advance(self, now: float) -> int:
        """The count of jobs late at `now` (which must not go back)."""
        if now < self.now:
            raise ValueError(f"the clock went back from {self.now} to {now}")
        self.now = now
        jobs, threshold = self.jobs, self.threshold
        at = self.settled
        while at < len(jobs) and jobs[at].job.submitted <= now - threshold:
            state = jobs[at]
            started = now if math.isnan(state.first_start) else state.first_start
            self.late += started - state.job.submitted > threshold
            at += 1
        self.settled = at
        return self.late


def late_limit(jobs: int) -> float:
    """More late jobs than this settle the p95 above the threshold (see the module)."""
    return 0.05 * jobs + 1


def fewest_passing(
    grid: Sequence[int],
    probe: Callable[[int], tuple[bool, R]],
    resolution: int,
    known: dict[int, tuple[bool, R]] | None = None,
) -> tuple[int | None, R | None, dict[int, tuple[bool, R]]]:
    """The fewest GPUs (a grid size or a multiple of `resolution`) at which
    `probe(size)` passes, with its result, and every probe made, by size.

    Grid sizes are probed in ascending order up to the first that passes (none: None);
    then bisection between it and the grid size below it (0 if it is the first). Sizes
    in `known` are not probed again."""
    probes: dict[int, tuple[bool, R]] = dict(known or {})

    def at(size: int) -> tuple[bool, R]:
        if size not in probes:
            probes[size] = probe(size)
        return probes[size]

    low = 0
    high: int | None = None
    for size in sorted(grid):
        if at(size)[0]:
            high = size
            break
        low = size
    if high is None:
        return None, None, probes
    best = at(high)[1]
    while high - low > resolution:
        middle = (low + high) // 2 // resolution * resolution
        if middle <= low:
            break
        passed, result = at(middle)
        if passed:
            high, best = middle, result
        else:
            low = middle
    return high, best, probes
