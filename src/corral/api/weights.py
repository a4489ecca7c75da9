"""Time-decayed fair share in words: a queue's effective over-quota weight and why, for
`corral why`, the queue API and the dashboard's queue view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.model import Queue, QueueStatus
from corral.model.durations import format_duration
from corral.model.usage import DecaySetting, decay_settings

# Weights closer than this read as unchanged.
_SAME = 1e-9


def settings_of(queues: Sequence[Queue]) -> dict[str, DecaySetting]:
    """The time-decayed fair share settings of the queues where it is on, as inherited."""
    return decay_settings(queues)


def weight_reason(
    queue: Queue, status: QueueStatus | None, settings: Mapping[str, DecaySetting]
) -> str | None:
    """ "weight 2 → 0.6: used 70% of the cluster's GPU-time over a 1d half-life", or None
    where time-decayed fair share is off (or before the first cycle). `settings` are the
    queues' own as they are now: a cycle that ran before the queue's was turned off has
    nothing to explain any more."""
    setting = settings.get(queue.name)
    if status is None or status.weight is None or setting is None:
        return None
    base = queue.over_quota_weight.gpu
    over = f" over a {format_duration(setting.half_life)} half-life"
    if setting.k != 1:
        over += f" (k = {setting.k:g})"
    used = f"used {(status.usage or 0.0):.0%} of the cluster's GPU-time{over}"
    if abs(status.weight - base) <= _SAME:
        return f"weight {base:g}, unchanged: {used}"
    return f"weight {base:g} → {status.weight:.2g}: {used}"
