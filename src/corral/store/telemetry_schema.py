"""Tables of telemetry and accounting (migration 0002).

Raw samples are kept 24 hours, 1-minute rollups 30 days, hourly rollups after that (see
docs/visibility.md for the storage bound). Allocation intervals are the ground truth of
GPU-hours allocated: one row per task per stretch of time it held its devices.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from corral.store.schema import KEY, NAME, Base


class Measured:
    """What every telemetry table holds of a device: which one, the task on it and its
    share, the seconds the row stands for (at most 60 in a minute row when sampling is
    regular), and what was measured (time-weighted averages in rollups)."""

    node: Mapped[str] = mapped_column(String(NAME))
    device: Mapped[int] = mapped_column(Integer)
    workload: Mapped[str | None] = mapped_column(String(KEY))
    task: Mapped[int | None] = mapped_column(Integer)
    share: Mapped[float] = mapped_column(Float)
    seconds: Mapped[float] = mapped_column(Float)
    utilization: Mapped[float] = mapped_column(Float)
    memory_used: Mapped[int] = mapped_column(BigInteger)
    memory_total: Mapped[int] = mapped_column(BigInteger)
    power: Mapped[float | None] = mapped_column(Float)
    temperature: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))


class TelemetryRawRow(Measured, Base):
    """One sample as an agent reported it (corral.model.telemetry.Sample)."""

    __tablename__ = "telemetry_raw"
    __table_args__ = (
        Index("ix_telemetry_raw_time", "time"),
        Index("ix_telemetry_raw_minute", "minute"),
        Index("ix_telemetry_raw_workload", "workload", "time"),
        Index("ix_telemetry_raw_device", "node", "device", "time"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[float] = mapped_column(Float)
    # The minute (its start) of the middle of the stretch the sample stands for, so that
    # rollups group without date arithmetic in SQL.
    minute: Mapped[float] = mapped_column(Float)


class TelemetryMinuteRow(Measured, Base):
    """The samples of one minute, per device and task: time-weighted averages."""

    __tablename__ = "telemetry_minute"
    __table_args__ = (
        Index("ix_telemetry_minute_minute", "minute"),
        Index("ix_telemetry_minute_hour", "hour"),
        Index("ix_telemetry_minute_workload", "workload", "minute"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    minute: Mapped[float] = mapped_column(Float)
    hour: Mapped[float] = mapped_column(Float)
    # The raw samples the row stands for.
    samples: Mapped[int] = mapped_column(Integer)


class TelemetryHourRow(Measured, Base):
    """The minutes of one hour, per device and task: time-weighted averages."""

    __tablename__ = "telemetry_hour"
    __table_args__ = (
        Index("ix_telemetry_hour_hour", "hour"),
        Index("ix_telemetry_hour_workload", "workload", "hour"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hour: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)


class TelemetryStateRow(Base):
    """Watermarks of the rollups and of retention, by name (see corral.store.telemetry)."""

    __tablename__ = "telemetry_state"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class AllocationRow(Base):
    """One task holding its devices from `start` to `end` (NULL while it holds them).

    Names, not foreign keys: the interval outlives the workload, its project and its node,
    so that past GPU-hours are never lost when those are deleted. `departments` are the
    project's ancestor queues when the task was bound, nearest first.
    """

    __tablename__ = "allocations"
    __table_args__ = (
        Index("ix_allocations_open", "end"),
        Index("ix_allocations_start", "start"),
        Index("ix_allocations_placement", "placement_id"),
        Index("ix_allocations_workload", "workload"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The placement row that holds the devices meanwhile (no foreign key: it is deleted).
    placement_id: Mapped[int | None] = mapped_column(Integer)
    workload: Mapped[str] = mapped_column(String(KEY))
    task: Mapped[int] = mapped_column(Integer)
    project: Mapped[str] = mapped_column(String(NAME))
    departments: Mapped[list[Any]] = mapped_column(JSON, default=list)
    user: Mapped[str] = mapped_column(String(NAME))
    priority: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(NAME))
    devices: Mapped[list[Any]] = mapped_column(JSON, default=list)
    gpu: Mapped[float] = mapped_column(Float)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float | None] = mapped_column(Float)
