"""Rollups and retention on samples whose times the test sets, on SQLite and PostgreSQL.

Averages are weighted by the time each sample stands for; the expected figures are
worked out by hand in the comments.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from vis_timeline import HOUR, MINUTE, T, every_minute, sample

from corral.store import Store
from corral.store.telemetry import (
    MAX_HOURS_PER_ROLLUP,
    Watermarks,
    record_samples,
    rollup,
    watermarks,
)
from corral.store.telemetry_reads import workload_samples
from corral.store.telemetry_schema import TelemetryHourRow, TelemetryMinuteRow, TelemetryRawRow

DAY = 24 * HOUR


def rows(store: Store, table: type) -> list:
    with store.read() as session:
        return list(session.scalars(select(table).order_by(table.id)).all())


def marks(store: Store) -> Watermarks:
    with store.read() as session:
        return watermarks(session)


def count(store: Store, table: type) -> int:
    with store.read() as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


def first_two_minutes(store: Store) -> None:
    record_samples(
        store,
        [
            # Minute 0 of hour T, device 0 held by w: utilisation (0*10 + 60*20 + 90*30) / 60
            # = 65; power (100*10 + 200*30) / 40 = 175 (the sample without power does not
            # count); memory and temperature keep their peaks.
            sample(T + 10, 0, seconds=10, memory=1 << 30, power=100, temperature=40),
            sample(T + 30, 60, seconds=20, memory=3 << 30, power=None, temperature=55),
            sample(T + 59.5, 90, seconds=30, memory=2 << 30, power=200, temperature=50),
            # Minute 1: 50% throughout.
            sample(T + 90, 50, seconds=30),
            sample(T + 119, 50, seconds=30),
            # Device 1 is free: one row for the device, nobody's.
            sample(T + 30, 0, workload=None, device=1, seconds=60, source="none"),
        ],
    )


def test_a_finished_minute_is_rolled_up_with_time_weighted_averages(store: Store) -> None:
    first_two_minutes(store)
    # At T+125 s, minute 0 ended more than the 60 s lag ago; minute 1 did not.
    result = rollup(store, T + 125)
    assert result.minutes == 2  # minute 0 of w on device 0, and of the free device 1
    minutes = {(row.device, row.workload): row for row in rows(store, TelemetryMinuteRow)}
    held = minutes[(0, "w")]
    assert held.minute == T and held.hour == T
    assert held.utilization == pytest.approx(65.0)
    assert held.seconds == pytest.approx(60.0)
    assert held.samples == 3
    assert held.power == pytest.approx(175.0)
    assert held.temperature == 55
    assert held.memory_used == 3 << 30
    assert held.share == 1.0
    free = minutes[(1, None)]
    assert free.utilization == 0 and free.task is None and free.source == "none"
    assert marks(store).raw_rolled_until == T + MINUTE


def test_every_minute_is_rolled_up_once_however_often_rollup_runs(store: Store) -> None:
    first_two_minutes(store)
    for now in (T + 125, T + 125, T + 130, T + 185, T + 185):
        rollup(store, now)
    minutes = rows(store, TelemetryMinuteRow)
    assert sorted((row.minute, row.device) for row in minutes) == [(T, 0), (T, 1), (T + 60, 0)]
    assert [row.utilization for row in minutes if row.minute == T + 60] == [50.0]
    # Raw samples are kept for 24 hours, rolled up or not.
    assert count(store, TelemetryRawRow) == 6


def test_a_finished_hour_is_rolled_up_from_its_minutes(store: Store) -> None:
    first_two_minutes(store)
    # Once the minutes of hour T are all rolled up: (65 * 60 + 50 * 60) / 120 = 57.5.
    rollup(store, T + HOUR + 2 * MINUTE)
    hours = [row for row in rows(store, TelemetryHourRow) if row.workload == "w"]
    assert len(hours) == 1
    assert hours[0].hour == T
    assert hours[0].utilization == pytest.approx(57.5)
    assert hours[0].seconds == pytest.approx(120.0)
    assert hours[0].samples == 5
    assert hours[0].temperature == 55


def test_raw_samples_go_after_24_hours_minutes_after_30_days(store: Store) -> None:
    first_two_minutes(store)
    record_samples(store, [sample(T + DAY + 10 * MINUTE + 30, 40, seconds=60)])
    rollup(store, T + HOUR + 2 * MINUTE)
    assert count(store, TelemetryRawRow) == 7

    # A day and a bit later the first two minutes' raw samples are gone, their minute rows
    # are not; the sample taken a day later is still within its 24 hours.
    rollup(store, T + DAY + 12 * MINUTE)
    assert [row.time for row in rows(store, TelemetryRawRow)] == [T + DAY + 10 * MINUTE + 30]
    assert count(store, TelemetryMinuteRow) == 4  # T (w, free), T+60 (w), T+1d+10m (w)

    # After 30 days and an hour the minutes of hour T are gone; its hour rows stay.
    now = T + 30 * DAY + HOUR + MINUTE
    while marks(store).raw_rolled_until < now - 2 * MINUTE:
        rollup(store, now)
    assert [row.minute for row in rows(store, TelemetryMinuteRow)] == [T + DAY + 10 * MINUTE]
    hours = sorted((row.hour, row.workload or "") for row in rows(store, TelemetryHourRow))
    assert hours == [(T, ""), (T, "w"), (T + DAY, "w")]
    kept = marks(store)
    assert kept.raw_kept_from == T + 29 * DAY + HOUR + MINUTE
    assert kept.minute_kept_from == T + HOUR


def test_nothing_is_deleted_before_it_was_rolled_up(store: Store) -> None:
    # Three days of samples that were never rolled up (the server was down, say): one
    # rollup handles at most a day of them, so raw samples past 24 hours must wait.
    record_samples(store, every_minute(T, 3 * 24 * 60, 20))
    now = T + 3 * DAY + 5 * MINUTE
    first = rollup(store, now)
    assert first.minutes == MAX_HOURS_PER_ROLLUP * 60
    assert first.raw_deleted == MAX_HOURS_PER_ROLLUP * 60
    while marks(store).raw_rolled_until < now - 2 * MINUTE:
        rollup(store, now)
    minutes = rows(store, TelemetryMinuteRow)
    assert len(minutes) == 3 * 24 * 60
    assert {row.utilization for row in minutes} == {20.0}
    # Exactly the last 24 hours of raw samples are left: the samples of the minutes from
    # T + 2 days + 5 minutes to the last one, at T + 3 days - 1 minute.
    remaining = rows(store, TelemetryRawRow)
    assert min(row.minute for row in remaining) == now - DAY
    assert len(remaining) == 24 * 60 - 5
    # Every hour but the last two days' hours were rolled up in turn as well.
    hours = rows(store, TelemetryHourRow)
    assert len(hours) == 3 * 24
    assert {row.utilization for row in hours} == {20.0}


def test_a_workloads_series_uses_raw_samples_then_rollups(store: Store) -> None:
    record_samples(store, every_minute(T, 3, 10) + every_minute(T + 2 * DAY, 2, 70))
    now = T + 2 * DAY + 10 * MINUTE
    while marks(store).raw_rolled_until < now - 2 * MINUTE:
        rollup(store, now)
    found = workload_samples(store, "w", T - HOUR, now)
    # The first three minutes are past raw retention: their minute rows, at each minute's
    # start; the recent ones are raw samples at their own times (each minute's end).
    assert [(s.time, s.utilization) for s in found] == [
        (T, 10.0),
        (T + 60, 10.0),
        (T + 120, 10.0),
        (T + 2 * DAY + 60, 70.0),
        (T + 2 * DAY + 120, 70.0),
    ]
    assert workload_samples(store, "other", T - HOUR, now) == []
