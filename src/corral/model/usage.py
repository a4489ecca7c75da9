"""Time-decayed usage: how much of the cluster's GPU-time a queue has had lately.

A queue's record holds two decayed sums, both with the queue's half-life: the GPU-seconds
its work held, and the GPU-seconds all work held. Their ratio is the queue's usage share
(0 to 1), which the engine weighs against its over-quota weight (time-decayed fair share,
docs/scheduling.md). The server (on its clock) and the simulator (on its virtual clock)
both advance records with `advance`, so the two keep the same history.

While allocations stay the same, holding `a` GPUs for `t` seconds with half-life `h` adds
the integral of `a` decayed from each moment to the end of the interval:
`a * h / ln 2 * (1 - 2^(-t/h))`. The sum is exact for allocations that change only at
the points where `advance` is called, so the result does not depend on how often it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from corral.model.types import Queue

_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class DecayedUsage:
    """A queue's decayed GPU-seconds (`gpu_seconds`) and the whole cluster's
    (`cluster_gpu_seconds`), both decayed with the queue's half-life."""

    gpu_seconds: float = 0.0
    cluster_gpu_seconds: float = 0.0

    @property
    def share(self) -> float:
        """The queue's share of the cluster's decayed GPU-time (0 when nothing ran)."""
        if self.cluster_gpu_seconds <= 0:
            return 0.0
        return min(max(self.gpu_seconds / self.cluster_gpu_seconds, 0.0), 1.0)


def decay(amount: float, elapsed: float, half_life: float) -> float:
    """`amount` after `elapsed` seconds of decay with `half_life` (seconds, > 0)."""
    if elapsed <= 0:
        return amount
    return amount * math.exp(-_LN2 * elapsed / half_life)


def held_for(gpus: float, elapsed: float, half_life: float) -> float:
    """The decayed GPU-seconds of holding `gpus` for the last `elapsed` seconds."""
    if elapsed <= 0 or gpus <= 0:
        return 0.0
    return gpus * half_life / _LN2 * -math.expm1(-_LN2 * elapsed / half_life)


def advance(
    usage: DecayedUsage, gpus: float, cluster_gpus: float, elapsed: float, half_life: float
) -> DecayedUsage:
    """`usage` after `elapsed` seconds in which the queue held `gpus` GPUs and all work
    held `cluster_gpus`."""
    return DecayedUsage(
        decay(usage.gpu_seconds, elapsed, half_life) + held_for(gpus, elapsed, half_life),
        decay(usage.cluster_gpu_seconds, elapsed, half_life)
        + held_for(cluster_gpus, elapsed, half_life),
    )


@dataclass(frozen=True, slots=True)
class DecaySetting:
    """A queue's time-decayed fair share, as inherited: its half-life (seconds) and
    usage factor `k`."""

    half_life: float
    k: float


def decay_settings(queues: Sequence[Queue]) -> dict[str, DecaySetting]:
    """The queues where time-decayed fair share is on, with their settings: each setting
    is the queue's own, else its nearest ancestor's; the policy is on where a half-life is
    found, and `k` defaults to 1. A parent missing from `queues` ends the walk."""
    by_name = {queue.name: queue for queue in queues}
    settings: dict[str, DecaySetting] = {}
    for queue in queues:
        half_life: float | None = None
        k: float | None = None
        level: Queue | None = queue
        seen: set[str] = set()
        while level is not None and level.name not in seen and (half_life is None or k is None):
            seen.add(level.name)
            half_life = level.fair_share_half_life if half_life is None else half_life
            k = level.fair_share_k if k is None else k
            level = by_name.get(level.parent) if level.parent is not None else None
        if half_life is not None:
            settings[queue.name] = DecaySetting(half_life, 1.0 if k is None else k)
    return settings
