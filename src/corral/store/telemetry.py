"""Telemetry in the store: raw samples, their rollups and retention, and the queries over them.

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, delete, func, insert, literal, or_, select
from sqlalchemy.orm import Session

from corral.model.telemetry import SOURCES, Sample
from corral.store.database import Database
from corral.store.errors import Invalid
from corral.store.telemetry_schema import (
    AllocationRow,
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


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch [start, end) of time and the table that covers it."""

    table: Table
    start: float
    end: float

    @property
    def bucket(self) -> float:
        """The length of one row's bucket: 0 for raw samples."""
        if self.table is TelemetryMinuteRow:
            return MINUTE
        if self.table is TelemetryHourRow:
            return HOUR
        return 0.0


def spans(marks: Watermarks, start: float, end: float, fine: bool) -> list[Span]:
    """The tables that cover [start, end), oldest first.

    Hours cover what is older than the minutes kept; `fine` prefers raw samples wherever
    they are kept (the last 24 hours), otherwise minutes are used wherever they were rolled
    up and raw samples only for the minutes not rolled up yet."""
    result = [Span(TelemetryHourRow, start, min(end, marks.minute_kept_from))]
    if fine:
        result.append(
            Span(
                TelemetryMinuteRow,
                max(start, marks.minute_kept_from),
                min(end, marks.raw_kept_from),
            )
        )
        result.append(Span(TelemetryRawRow, max(start, marks.raw_kept_from), end))
    else:
        result.append(
            Span(
                TelemetryMinuteRow,
                max(start, marks.minute_kept_from),
                min(end, marks.raw_rolled_until),
            )
        )
        result.append(
            Span(TelemetryRawRow, max(start, marks.minute_kept_from, marks.raw_rolled_until), end)
        )
    return [span for span in result if span.start < span.end]


def _time_column(table: Table) -> Any:
    if table is TelemetryRawRow:
        return TelemetryRawRow.time
    if table is TelemetryMinuteRow:
        return TelemetryMinuteRow.minute
    return TelemetryHourRow.hour


# -- GPU-seconds used and idle ------------------------------------------------------------------


@dataclass(slots=True)
class GpuSeconds:
    used: float = 0.0
    idle: float = 0.0


def gpu_seconds(
    session: Session,
    start: float,
    end: float,
    *,
    step: float | None = None,
    fine: bool = False,
) -> dict[tuple[float | None, str], GpuSeconds]:
    """GPU-seconds used (share * utilisation * seconds) and idle (share * seconds where the
    utilisation was 0) by workload within [start, end), keyed by (bucket, workload).

    Only the time a sample's task held its devices counts: the allocation intervals of the
    same workload, task and node (see corral.store.usage). A task started after it was
    bound and may run on past its release (a grace period to checkpoint, a stop order on
    its way), and what it did then was nobody's allocation: a workload's used and idle
    stay within the time it was allocated.

    With `step`, the bucket is the start of the step-long stretch from `start` that holds
    the time; without it, None. A raw sample stands for the `seconds` before its time and
    is spread over the steps of that stretch; a rollup row stands for its minute or hour
    and goes whole to the step of its start, counting at most for the time its task held
    its devices within that minute or hour. Rows that straddle `start` or `end` count in
    proportion to their overlap."""
    totals: dict[tuple[float | None, str], GpuSeconds] = {}

    def add(at: float, workload: str, used: float, idle: float, weight: float) -> None:
        bucket = None if step is None else start + floor_to(max(at, start) - start, step)
        entry = totals.setdefault((bucket, workload), GpuSeconds())
        entry.used += used * weight
        entry.idle += idle * weight

    for span in spans(watermarks(session), start, end, fine):
        if span.table is TelemetryRawRow:
            _raw_seconds(session, span, start, end, step, add)
        else:
            _rollup_seconds(session, span, add)
    return totals


Adder = Callable[[float, str, float, float, float], None]


def _least(first: Any, second: Any) -> Any:
    # Portable: SQLite's min() of two values is PostgreSQL's least().
    return case((first < second, first), else_=second)


def _greatest(first: Any, second: Any) -> Any:
    return case((first > second, first), else_=second)


def _held(table: Table, begin: Any, finish: Any, start: Any, end: Any) -> tuple[Any, Any, Any]:
    """How a row standing for [begin, finish) meets its task's allocation intervals within
    [start, end): the condition joining them, and the stretch [low, high) each shares."""
    held = AllocationRow
    joined = and_(
        held.workload == table.workload,
        held.task == table.task,
        held.node == table.node,
        held.start < finish,
        held.start < end,
        or_(held.end.is_(None), and_(held.end > begin, held.end > start)),
    )
    low = _greatest(_greatest(begin, held.start), start)
    high = _least(_least(finish, func.coalesce(held.end, finish)), end)
    return joined, low, high


def _rollup_seconds(session: Session, span: Span, add: Adder) -> None:
    table = span.table
    when = _time_column(table)
    length = span.bucket
    joined, low, high = _held(table, when, when + length, when, when + length)
    # Per row: the seconds its task held its devices within the row's minute or hour.
    rows = (
        select(
            when.label("at"),
            table.workload,
            table.share,
            table.utilization,
            table.seconds,
            func.sum(high - low).label("held"),
        )
        .join(AllocationRow, joined)
        .where(when >= floor_to(span.start, length), when < span.end, table.workload.is_not(None))
        .group_by(table.id, when, table.workload, table.share, table.utilization, table.seconds)
        .subquery()
    )
    counted = _least(rows.c.held, rows.c.seconds)
    used = func.sum(rows.c.share * rows.c.utilization * counted) / 100.0
    idle = func.sum(case((rows.c.utilization == 0, rows.c.share * counted), else_=0.0))
    query = select(rows.c.at, rows.c.workload, used, idle).group_by(rows.c.at, rows.c.workload)
    for at, workload, used_seconds, idle_seconds in session.execute(query).all():
        weight = max(min(at + length, span.end) - max(at, span.start), 0.0) / length
        if weight > 0:
            add(at, workload, float(used_seconds or 0.0), float(idle_seconds or 0.0), weight)


def _raw_seconds(
    session: Session, span: Span, start: float, end: float, step: float | None, add: Adder
) -> None:
    raw = TelemetryRawRow
    # Samples whose minute was rolled up belong to the minute rows; the edges of the period
    # asked for clip what each sample stands for, and so do its task's allocations.
    owned = [raw.workload.is_not(None), raw.time > start, raw.time - raw.seconds < end]
    if span.start > start:
        owned.append(raw.minute >= span.start)
    joined, low, high = _held(raw, raw.time - raw.seconds, raw.time, literal(start), literal(end))
    if step is None:
        width = high - low
        used = func.sum(raw.share * raw.utilization * width) / 100.0
        idle = func.sum(case((raw.utilization == 0, raw.share * width), else_=0.0))
        query = (
            select(raw.workload, used, idle)
            .join(AllocationRow, joined)
            .where(*owned)
            .group_by(raw.workload)
        )
        for workload, used_seconds, idle_seconds in session.execute(query).all():
            add(start, str(workload), float(used_seconds or 0.0), float(idle_seconds or 0.0), 1.0)
        return
    # For a series, each stretch held (summed over the devices sampled at one moment) is
    # spread over the steps it covers.
    used_gpus = func.sum(raw.share * raw.utilization) / 100.0
    idle_gpus = func.sum(case((raw.utilization == 0, raw.share), else_=0.0))
    query = (
        select(low.label("low"), high.label("high"), raw.workload, used_gpus, idle_gpus)
        .join(AllocationRow, joined)
        .where(*owned)
        .group_by(low, high, raw.workload)
    )
    for begin, finish, workload, used, idle in session.execute(query).all():
        while begin < finish:
            edge = min(start + (floor_to(begin - start, step) + step), finish)
            width = edge - begin
            add(begin, str(workload), float(used) * width, float(idle) * width, 1.0)
            begin = edge


# -- recent samples -----------------------------------------------------------------------------


def idle_since(
    session: Session, now: float, lookback: float, fresh: float = FRESH
) -> dict[str, float]:
    """Running workloads whose GPUs are all at 0% now, with the time of the first sample of
    that quiet stretch (looked for within `lookback` seconds, and only since the workload's
    devices were last bound). A workload whose latest sample is older than `fresh`, or that
    has no samples, is not listed: nothing is known about it."""
    raw = TelemetryRawRow
    held = (
        select(AllocationRow.workload, func.min(AllocationRow.start).label("start"))
        .where(AllocationRow.end.is_(None))
        .group_by(AllocationRow.workload)
        .subquery()
    )
    summary = (
        select(
            raw.workload.label("workload"),
            func.max(case((raw.utilization > 0, raw.time))).label("busy"),
            func.min(raw.time).label("first"),
            func.max(raw.time).label("last"),
        )
        .join(held, and_(held.c.workload == raw.workload, raw.time >= held.c.start))
        .where(raw.time >= now - lookback, raw.time <= now)
        .group_by(raw.workload)
        .subquery()
    )
    rows = session.execute(
        select(summary.c.workload, summary.c.busy, summary.c.first, summary.c.last)
    ).all()
    quiet: dict[str, float] = {}
    after_busy: list[str] = []
    for workload, busy, first, last in rows:
        if last < now - fresh or (busy is not None and busy >= last):
            continue
        if busy is None:
            quiet[workload] = float(first)
        else:
            after_busy.append(workload)
    if after_busy:
        first_zero = (
            select(raw.workload, func.min(raw.time))
            .join(summary, summary.c.workload == raw.workload)
            .where(
                raw.workload.in_(after_busy),
                raw.time > summary.c.busy,
                raw.time <= now,
                raw.utilization == 0,
            )
            .group_by(raw.workload)
        )
        for workload, since in session.execute(first_zero).all():
            quiet[str(workload)] = float(since)
    return quiet


def idle_workloads(session: Session, now: float, window: float) -> set[str]:
    """Running workloads whose GPUs have been at 0% for at least `window` seconds."""
    since = idle_since(session, now, window + FRESH)
    return {name for name, start in since.items() if now - start >= window}


def latest_samples(store: Database, now: float, fresh: float = FRESH) -> list[Sample]:
    """The newest sample of every device (one per task on a shared device), when it is
    no older than `fresh` seconds."""
    raw = TelemetryRawRow
    with store.read() as session:
        newest = (
            select(raw.node, raw.device, func.max(raw.time).label("time"))
            .where(raw.time >= now - fresh, raw.time <= now)
            .group_by(raw.node, raw.device)
            .subquery()
        )
        rows = session.scalars(
            select(raw)
            .join(
                newest,
                and_(
                    newest.c.node == raw.node,
                    newest.c.device == raw.device,
                    newest.c.time == raw.time,
                ),
            )
            .order_by(raw.node, raw.device, raw.workload, raw.task)
        ).all()
        return [_sample(row) for row in rows]


def _sample(row: TelemetryRawRow | TelemetryMinuteRow | TelemetryHourRow) -> Sample:
    if isinstance(row, TelemetryRawRow):
        time = row.time
    elif isinstance(row, TelemetryMinuteRow):
        time = row.minute
    else:
        time = row.hour
    return Sample(
        time=time,
        node=row.node,
        device=row.device,
        workload=row.workload,
        task=row.task,
        utilization=row.utilization,
        memory_used=row.memory_used,
        memory_total=row.memory_total,
        power=row.power,
        temperature=row.temperature,
        source=row.source,  # type: ignore[arg-type]
        share=row.share,
        seconds=row.seconds,
    )


def workload_samples(store: Database, workload: str, start: float, end: float) -> list[Sample]:
    """A workload's samples in [start, end), finest first: raw samples where they are kept,
    then minute and hour rollups (whose `time` is the start of their bucket)."""
    with store.read() as session:
        found: list[Sample] = []
        for span in spans(watermarks(session), start, end, fine=True):
            table = span.table
            when = _time_column(table)
            lower = floor_to(span.start, span.bucket) if span.bucket else span.start
            rows: Sequence[Any] = session.scalars(
                select(table)
                .where(table.workload == workload, when >= lower, when < span.end)
                .order_by(when, table.node, table.device, table.task)
            ).all()
            found.extend(_sample(row) for row in rows)
        return found
