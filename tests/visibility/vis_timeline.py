"""Building telemetry by hand: samples at times the test chooses."""

from __future__ import annotations

from corral.model.telemetry import Sample, SampleSource

# An hour boundary, so that minute and hour buckets fall where the tests expect them.
T = 1_800_000_000.0 // 3600 * 3600
MINUTE = 60.0
HOUR = 3600.0
GIB = 1 << 30


def sample(
    time: float,
    utilization: float,
    *,
    workload: str | None = "w",
    task: int | None = 0,
    device: int = 0,
    node: str = "n1",
    share: float = 1.0,
    seconds: float = 60.0,
    memory: int = GIB,
    power: float | None = None,
    temperature: float | None = None,
    source: SampleSource = "declared",
) -> Sample:
    return Sample(
        time=time,
        node=node,
        device=device,
        workload=workload,
        task=task if workload is not None else None,
        utilization=utilization,
        memory_used=memory,
        memory_total=80 * GIB,
        power=power,
        temperature=temperature,
        source=source,
        share=share if workload is not None else 0.0,
        seconds=seconds,
    )


def every_minute(start: float, minutes: int, utilization: float, **fields: object) -> list[Sample]:
    """One sample at the end of each minute from `start`, standing for that minute."""
    return [
        sample(start + (i + 1) * MINUTE, utilization, **fields)  # type: ignore[arg-type]
        for i in range(minutes)
    ]
