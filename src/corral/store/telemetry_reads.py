"""Reading telemetry from the store: which table covers which stretch of time (`spans`,
by the rollups' watermarks), GPU-seconds held and used, how long a workload's GPUs have
been idle, the latest samples and a workload's series."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, literal, or_, select
from sqlalchemy.orm import Session

from corral.model.telemetry import Sample
from corral.store.database import Database
from corral.store.telemetry import (
    FRESH,
    HOUR,
    MINUTE,
    Table,
    Watermarks,
    floor_to,
    watermarks,
)
from corral.store.telemetry_schema import (
    AllocationRow,
    TelemetryHourRow,
    TelemetryMinuteRow,
    TelemetryRawRow,
)


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
