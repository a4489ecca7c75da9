"""Durations as people write them: 90, "90s", "30m", "4h", "7d", "2w"."""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# Ten years: longer than any period worth asking about, short enough to stay exact.
MAX_DURATION = 10 * 365 * 86400.0


def parse_duration(value: object) -> float:
    """Seconds (more than 0, at most ten years) from a number or a string such as "30m".

    Raises ValueError saying what was wrong."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (for example 90, 30m, 4h, 7d)")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a duration (for example 90, 30m, 4h, 7d)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration (for example 90, 30m, 4h, 7d)")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{value!r} must be more than 0 seconds")
    if seconds > MAX_DURATION:
        raise ValueError(f"{value!r} is more than ten years")
    return seconds


def format_duration(seconds: float) -> str:
    """30m, 6s, 1h30m, 2d: a duration in its largest units, to the second (59.5s below a
    minute)."""
    total = round(seconds)
    if seconds < 60 and not math.isclose(seconds, total):
        return f"{seconds:g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            count, total = divmod(total, size)
            parts.append(f"{count}{unit}")
    return "".join(parts)


def format_span(seconds: float) -> str:
    """A time span for a sentence: "40 s", "6 min", "2.5 h" (0 below nothing)."""
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_gpu_time(gpu_seconds: float) -> str:
    """GPU time for a sentence: "40 GPU-s", "12 GPU-min", "3.5 GPU-h"."""
    return format_span(gpu_seconds).replace(" ", " GPU-")


def lost_work_phrase(gpu_seconds: float, span: float, from_checkpoint: bool) -> str:
    """What a preemption threw away, in words: `gpu_seconds` of work done in the `span`
    seconds before it, since the last checkpoint (`from_checkpoint`) or since the run
    started. "lost 12 GPU-min of work: last checkpoint 6 min before preemption"; a
    negative `span` is a checkpoint taken in the grace period, which lost nothing."""
    if span < 0:
        # The checkpoint came after the preemption, in its grace period.
        return "lost no work: it checkpointed when asked to stop"
    before = format_span(span)
    where = (
        f"last checkpoint {before} before preemption"
        if from_checkpoint
        else f"no checkpoint known; its run started {before} before preemption"
    )
    return f"lost {format_gpu_time(gpu_seconds)} of work: {where}"
