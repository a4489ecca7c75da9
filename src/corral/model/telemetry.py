"""Telemetry as plain data: one reading of one device, attributed to the task holding it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# "nvml": measured by the driver; "declared": what a task on a virtual device said through
# corral.sdk.report_utilization (0 when it said nothing lately); "none": a free virtual
# device, where there is nothing to measure.
SampleSource = Literal["nvml", "declared", "none"]
SOURCES: tuple[SampleSource, ...] = ("nvml", "declared", "none")


@dataclass(frozen=True, slots=True)
class Sample:
    """One device at one moment, as seen by one task (or by nobody, for a free device).

    `utilization` is a percentage of what the row's subject holds: of the task's share of
    the device when `workload` is set (100 = using all it was given), of the whole device
    otherwise. `share` is the part of the device the task was allocated (1.0 for a whole
    device, 0.5 for half of one; 0.0 for a free device). `seconds` is the stretch of time
    the sample stands for (the time since the previous sample, or since the task started
    when that is later), so that GPU-seconds used = share * utilization / 100 * seconds.
    A device shared by several tasks gives one sample per task.
    """

    time: float
    node: str
    device: int
    workload: str | None
    task: int | None
    utilization: float
    memory_used: int
    memory_total: int
    power: float | None
    temperature: float | None
    source: SampleSource
    share: float = 0.0
    seconds: float = 0.0

    @property
    def gpus_used(self) -> float:
        """How many devices' worth of compute the subject used (share * utilization)."""
        return self.share * self.utilization / 100.0
