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
