"""Telemetry in the store: raw samples, their rollups and retention (the queries over them
are corral.store.telemetry_reads).

Raw samples are rolled into 1-minute rows once their minute is over (with a lag, so that
samples still on their way are not missed), minutes into hourly rows once their hour is
over; raw samples older than RAW_RETENTION and minutes older than MINUTE_RETENTION are
deleted, never before they were rolled up. Watermarks in `telemetry_state` record how far
each step got, so that every rollup is done exactly once, and tell the queries which table
covers which stretch of time.

Utilisation is averaged weighted by time (each sample stands for `seconds`); memory and
temperature keep the peak; power is a time-weighted average.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, delete, func, insert, literal, select
from sqlalchemy.orm import Session

from corral.model.telemetry import SOURCES, Sample
from corral.store.database import Database
from corral.store.errors import Invalid
from corral.store.telemetry_schema import (
    TelemetryHourRow,
    TelemetryMinuteRow,
    TelemetryRawRow,
    TelemetryStateRow,
)

MINUTE = 60.0
HOUR = 3600.0
RAW_RETENTION = 24 * HOUR
MINUTE_RETENTION = 30 * 24 * HOUR
# A minute is rolled up this long after it ended: later samples of it would be lost.
ROLLUP_LAG = 60.0
# The most hours of raw samples rolled up by one call, so that catching up on a backlog
# does not hold the write lock for long; the next calls do the rest.
MAX_HOURS_PER_ROLLUP = 24
# A device whose latest sample is older than this has no current reading.
FRESH = 60.0

RAW_ROLLED = "raw_rolled_until"
MINUTE_ROLLED = "minute_rolled_until"
RAW_KEPT = "raw_kept_from"
MINUTE_KEPT = "minute_kept_from"

Table = type[TelemetryRawRow] | type[TelemetryMinuteRow] | type[TelemetryHourRow]


def floor_to(value: float, step: float) -> float:
    return math.floor(value / step) * step


# -- writing --------------------------------------------------------------------------------


def record_samples(store: Database, samples: Iterable[Sample]) -> int:
    """Store samples as agents report them; returns how many were stored.

    Utilisation is clamped to 0..100 and `seconds` to at least a millisecond, so that
    averages weighted by time are always defined."""
    rows = [_raw_values(sample) for sample in samples]
    if not rows:
        return 0
    with store.write(relevant=False) as session:
        session.execute(insert(TelemetryRawRow), rows)
    return len(rows)


def _raw_values(sample: Sample) -> dict[str, Any]:
    if sample.source not in SOURCES:
        raise Invalid("source", f"{sample.source!r} is not one of {', '.join(SOURCES)}")
    return {
        "time": sample.time,
        # The minute of the middle of the stretch the sample stands for.
        "minute": floor_to(sample.time - max(sample.seconds, 1e-3) / 2, MINUTE),
        "node": sample.node,
        "device": sample.device,
        "workload": sample.workload,
        "task": sample.task,
        "share": max(sample.share, 0.0),
        "seconds": max(sample.seconds, 1e-3),
        "utilization": min(max(sample.utilization, 0.0), 100.0),
        "memory_used": max(int(sample.memory_used), 0),
        "memory_total": max(int(sample.memory_total), 0),
        "power": sample.power,
        "temperature": sample.temperature,
        "source": sample.source,
    }


# -- rollups and retention ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Watermarks:
    """How far rollups and retention got; 0 where nothing was done yet."""

    raw_rolled_until: float = 0.0
    minute_rolled_until: float = 0.0
    raw_kept_from: float = 0.0
    minute_kept_from: float = 0.0


def watermarks(session: Session) -> Watermarks:
    values = dict(session.execute(select(TelemetryStateRow.name, TelemetryStateRow.value)).all())
    return Watermarks(
        raw_rolled_until=values.get(RAW_ROLLED, 0.0),
        minute_rolled_until=values.get(MINUTE_ROLLED, 0.0),
        raw_kept_from=values.get(RAW_KEPT, 0.0),
        minute_kept_from=values.get(MINUTE_KEPT, 0.0),
    )


def _set(session: Session, name: str, value: float) -> None:
    row = session.get(TelemetryStateRow, name)
    if row is None:
        session.add(TelemetryStateRow(name=name, value=value))
    else:
        row.value = value


@dataclass(frozen=True, slots=True)
class RollupResult:
    minutes: int
    hours: int
    raw_deleted: int
    minutes_deleted: int
    hours_deleted: int


def rollup(
    store: Database,
    now: float,
    *,
    lag: float = ROLLUP_LAG,
    raw_retention: float = RAW_RETENTION,
    minute_retention: float = MINUTE_RETENTION,
    hour_retention: float | None = None,
) -> RollupResult:
    """Roll finished minutes of raw samples into minute rows and finished hours of minutes
    into hour rows, then delete raw samples older than `raw_retention` and minutes older
    than `minute_retention` (hours too, older than `hour_retention`, when given). Nothing is
    deleted before it was rolled up. One transaction; safe to call at any interval."""
    with store.write(relevant=False) as session:
        marks = watermarks(session)
        end = floor_to(now - lag, MINUTE)
        rolled = session.get(TelemetryStateRow, RAW_ROLLED)
        start = rolled.value if rolled is not None else _first(session, TelemetryRawRow.minute)
        minutes = 0
        if start is None:
            start = end
        else:
            # Hour by hour, skipping hours without samples.
            chunks = 0
            while start < end and chunks < MAX_HOURS_PER_ROLLUP:
                following = session.scalar(
                    select(func.min(TelemetryRawRow.minute)).where(
                        TelemetryRawRow.minute >= start, TelemetryRawRow.minute < end
                    )
                )
                if following is None:
                    start = end
                    break
                start = max(start, floor_to(following, HOUR))
                upto = min(floor_to(start, HOUR) + HOUR, end)
                minutes += _minutes_from_raw(session, start, upto)
                chunks += 1
                start = upto
        _set(session, RAW_ROLLED, start)

        hour_end = floor_to(start, HOUR)
        hour_mark = session.get(TelemetryStateRow, MINUTE_ROLLED)
        hour_start = (
            hour_mark.value if hour_mark is not None else _first(session, TelemetryMinuteRow.hour)
        )
        hours = 0
        if hour_start is None:
            hour_start = hour_end
        elif hour_start < hour_end:
            hours = _hours_from_minutes(session, hour_start, hour_end)
            hour_start = hour_end
        _set(session, MINUTE_ROLLED, hour_start)

        raw_cut = min(floor_to(now - raw_retention, MINUTE), start)
        raw_deleted = _delete_before(session, TelemetryRawRow.minute, raw_cut)
        _set(session, RAW_KEPT, max(marks.raw_kept_from, raw_cut))

        minute_cut = min(floor_to(now - minute_retention, HOUR), hour_start)
        minutes_deleted = _delete_before(session, TelemetryMinuteRow.minute, minute_cut)
        _set(session, MINUTE_KEPT, max(marks.minute_kept_from, minute_cut))

        hours_deleted = 0
        if hour_retention is not None:
            hours_deleted = _delete_before(
                session, TelemetryHourRow.hour, floor_to(now - hour_retention, HOUR)
            )
        return RollupResult(minutes, hours, raw_deleted, minutes_deleted, hours_deleted)


def _first(session: Session, column: Any) -> float | None:
    value = session.scalar(select(func.min(column)))
    return float(value) if value is not None else None


def _delete_before(session: Session, column: Any, cut: float) -> int:
    result = session.execute(delete(column.class_).where(column < cut))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _weighted(column: Any, weight: Any) -> Any:
    """Average of `column` weighted by `weight`, over the rows where `column` is known."""
    known = func.sum(case((column.is_not(None), weight)))
    return func.sum(column * weight) / known


# What a rollup row holds after its time: the device and task, and the measures.
_ROLLED = [
    "node",
    "device",
    "workload",
    "task",
    "share",
    "seconds",
    "samples",
    "utilization",
    "memory_used",
    "memory_total",
    "power",
    "temperature",
    "source",
]


def _rolled(rows: Any, samples: Any) -> list[Any]:
    """The `_ROLLED` columns aggregated over `rows` (raw samples or minutes) grouped by
    time, device, task and source; `samples` counts the raw samples."""
    return [
        rows.node,
        rows.device,
        rows.workload,
        rows.task,
        func.max(rows.share),
        func.sum(rows.seconds),
        samples,
        func.sum(rows.utilization * rows.seconds) / func.sum(rows.seconds),
        func.max(rows.memory_used),
        func.max(rows.memory_total),
        _weighted(rows.power, rows.seconds),
        func.max(rows.temperature),
        rows.source,
    ]


def _minutes_from_raw(session: Session, start: float, end: float) -> int:
    """Minute rows for the raw samples of [start, end), which lies within one hour."""
    raw = TelemetryRawRow
    query = (
        select(raw.minute, literal(floor_to(start, HOUR)), *_rolled(raw, func.count()))
        .where(raw.minute >= start, raw.minute < end)
        .group_by(raw.minute, raw.node, raw.device, raw.workload, raw.task, raw.source)
    )
    target = TelemetryMinuteRow
    session.execute(insert(target).from_select(["minute", "hour", *_ROLLED], query))
    # Counted, since drivers differ in what rowcount says of INSERT ... SELECT.
    return _count(session, target.minute, start, end)


def _hours_from_minutes(session: Session, start: float, end: float) -> int:
    minute = TelemetryMinuteRow
    query = (
        select(minute.hour, *_rolled(minute, func.sum(minute.samples)))
        .where(minute.hour >= start, minute.hour < end)
        .group_by(
            minute.hour, minute.node, minute.device, minute.workload, minute.task, minute.source
        )
    )
    session.execute(insert(TelemetryHourRow).from_select(["hour", *_ROLLED], query))
    return _count(session, TelemetryHourRow.hour, start, end)


def _count(session: Session, column: Any, start: float, end: float) -> int:
    found = session.scalar(select(func.count()).where(column >= start, column < end))
    return int(found or 0)


# -- which table covers which time ------------------------------------------------------------
