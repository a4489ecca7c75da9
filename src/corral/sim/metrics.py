"""What a simulation measures: time-weighted GPU use per project, a sampled time series,
and per-job delays; summaries and the formulas behind them.

Definitions (all over the trace's window unless said otherwise):
- allocation: GPU-seconds held by running work over (cluster GPUs x window).
- utilisation: GPU-seconds kept busy (held x the job's utilisation) over the same, only
  when every job of the trace gives its utilisation.
- queueing delay: first start minus submission; a job that never started counts until the
  end of the simulation (a lower bound; `unstarted` says how many).
- job completion time (JCT): end minus submission, for jobs that finished.
- fairness: Jain's index over projects of the share of their entitlement they received:
  a project is entitled at each moment to min(quota, demand), demand being the GPUs it
  holds plus those its pending work asks for; it receives min(held, entitled).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]

HOUR = 3600.0
# Rows of the per-project levels: held GPUs, busy GPUs, pending GPUs, entitled, received.
HELD, BUSY, PENDING, ENTITLED, RECEIVED = range(5)
_SERIES_ROWS = 3
_NICE_SAMPLES = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass(frozen=True, slots=True)
class Stats:
    """Mean and percentiles (linear interpolation) of some durations in seconds."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None


def stats(values: Sequence[float] | Floats) -> Stats:
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return Stats(0, None, None, None, None)
    p50, p95, p99 = (float(value) for value in np.percentile(data, (50, 95, 99)))
    return Stats(int(data.size), float(data.mean()), p50, p95, p99)


def jain(values: Sequence[float] | Floats) -> float | None:
    """Jain's fairness index, (sum x)^2 / (n sum x^2): 1 when all equal, 1/n at worst."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return None
    squares = float((data * data).sum())
    if squares == 0:
        return 1.0
    return float(data.sum() ** 2 / (data.size * squares))


def sample_interval(window: float, cycle: float) -> float:
    """A round sampling interval giving at most about 400 samples over `window`."""
    wanted = max(window / 400, cycle)
    return float(next((nice for nice in _NICE_SAMPLES if nice >= wanted), math.ceil(wanted)))


class Recorder:
    """Integrates each project's levels over time, over the window and over the whole run,
    and sums them into sampling buckets. Call `advance(now)` before every change."""

    def __init__(self, quotas: Sequence[float], window: float, sample: float) -> None:
        count = len(quotas)
        self.quotas = np.asarray(quotas, dtype=np.float64)
        self.window = window
        self.sample = sample
        self.now = 0.0
        self.held = np.zeros(count)
        self.busy = np.zeros(count)
        self.pending = np.zeros(count)
        self.in_window = np.zeros((5, count))
        self.in_run = np.zeros((5, count))
        self.peak_pending = 0.0
        self._buckets = np.zeros((64, _SERIES_ROWS, count))
        self._levels: Floats | None = None

    def advance(self, now: float) -> None:
        span = now - self.now
        if span <= 0:
            return
        levels = self._levels if self._levels is not None else self._compute_levels()
        self.in_run += levels * span
        if self.now < self.window:
            self.in_window += levels * (min(now, self.window) - self.now)
        self._bucket(self.now, now, levels[:_SERIES_ROWS])
        self.now = now

    def change(
        self, project: int, held: float = 0.0, busy: float = 0.0, pending: float = 0.0
    ) -> None:
        self.held[project] += held
        self.busy[project] += busy
        self.pending[project] += pending
        self._levels = None
        if pending > 0:
            self.peak_pending = max(self.peak_pending, float(self.pending.sum()))

    def series(self, end: float) -> tuple[Floats, Floats]:
        """Bucket start times and each bucket's mean levels (rows: held, busy, pending;
        one column per project), up to `end`."""
        count = max(math.ceil(end / self.sample), 1)
        self._grow(count)
        starts = np.arange(count) * self.sample
        lengths = np.minimum(starts + self.sample, end) - starts
        means: Floats = self._buckets[:count] / np.maximum(lengths, 1e-12)[:, None, None]
        return starts.astype(np.float64), means

    def _compute_levels(self) -> Floats:
        held = np.maximum(self.held, 0.0)
        entitled = np.minimum(self.quotas, held + np.maximum(self.pending, 0.0))
        self._levels = np.vstack(
            (held, self.busy, self.pending, entitled, np.minimum(held, entitled))
        )
        return self._levels

    def _bucket(self, start: float, end: float, levels: Floats) -> None:
        first = int(start // self.sample)
        last = int(end // self.sample)
        self._grow(last + 1)
        if first == last:
            self._buckets[first] += levels * (end - start)
            return
        self._buckets[first] += levels * ((first + 1) * self.sample - start)
        if last > first + 1:
            self._buckets[first + 1 : last] += levels * self.sample
        self._buckets[last] += levels * (end - last * self.sample)

    def _grow(self, count: int) -> None:
        if count > len(self._buckets):
            size = max(count, 2 * len(self._buckets))
            grown = np.zeros((size, *self._buckets.shape[1:]))
            grown[: len(self._buckets)] = self._buckets
            self._buckets = grown


@dataclass(frozen=True, slots=True)
class ProjectResult:
    """One project's outcome. GPU amounts are means over the window; hours are totals."""

    quota: float
    jobs: int
    completed: int
    unstarted: int
    gpu_hours: float
    mean_gpus: float
    mean_pending_gpus: float
    entitlement_received: float | None
    queueing_delay: Stats
    completion_time: Stats
    preemptions: int
    lost_gpu_hours: float


@dataclass(frozen=True, slots=True)
class Series:
    """Sampled means: `times` are bucket starts (s); `held`, `busy` and `pending` have one
    column per project (in `SimResult.projects` order)."""

    times: Floats
    held: Floats
    busy: Floats
    pending: Floats


@dataclass(frozen=True, slots=True)
class SimResult:
    """Everything one simulation measured."""

    policy: str
    gpus: float
    window: float
    end: float
    projects: tuple[str, ...]
    jobs: int
    completed: int
    unstarted: int
    allocation: float
    utilisation: float | None
    queueing_delay: Stats
    completion_time: Stats
    gpu_hours: float
    mean_pending_gpus: float
    peak_pending_gpus: float
    fairness: float | None
    preemptions: int
    evictions_by_action: Mapping[str, int]
    lost_gpu_hours: float
    restart_gpu_hours: float
    cycles: int
    skipped_cycles: int
    wall_seconds: float
    by_project: Mapping[str, ProjectResult]
    series: Series
