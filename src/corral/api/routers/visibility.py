"""Allocation against utilisation: telemetry series, devices now, GPU-hours, /metrics.

Every endpoint under /api/v1 needs a valid token of any role; /metrics needs none, as
Prometheus scrapes it. Periods are given as `since` (seconds, or "30m", "24h", "7d")
before `until` (seconds since the epoch; now by default).
"""

from __future__ import annotations

import csv
import io
import math
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, BeforeValidator, Field

from corral.api.deps import (
    API,
    ProjectQuery,
    StoreDep,
    User,
    readable_projects,
    visible_workload,
)
from corral.api.routes import PrefixedRoute, serve
from corral.api.schemas.common import ErrorOut
from corral.control.metrics import StateCollector, now_state
from corral.control.plane import Loop
from corral.model.durations import parse_duration
from corral.model.spec import short_name, workload_key
from corral.store import NotFound, Store, WorkloadRecord
from corral.store.telemetry_reads import workload_samples
from corral.store.usage import USAGE_KEYS, UsageKey, series, usage

MAX_POINTS = 10_000


# -- responses ------------------------------------------------------------------------------


class ClusterPoint(BaseModel):
    time: float = Field(description="start of the step, seconds since the epoch")
    gpus: int = Field(description="GPUs registered now")
    allocated: float = Field(description="GPUs held by tasks, on average over the step")
    used: float = Field(description="GPUs' worth of compute used, on average over the step")


class ClusterSeriesOut(BaseModel):
    since: float
    until: float
    step: float
    series: list[ClusterPoint]


class QueuePoint(BaseModel):
    time: float
    allocated: float
    used: float
    deserved: float = Field(description="the queue's deserved GPUs now")


class QueueSeriesOut(BaseModel):
    since: float
    until: float
    step: float
    series: dict[str, list[QueuePoint]] = Field(description="by queue: projects and departments")


class WorkloadPoint(BaseModel):
    time: float = Field(description="of the sample; of its bucket's start for rollups")
    node: str
    device: int
    task: int | None
    utilization: float = Field(description="percent of the task's share of the device")
    memory_used: int
    source: Literal["nvml", "declared", "none"] = Field(
        description="nvml: measured; declared: what the task reported (virtual devices)"
    )


class WorkloadSeriesOut(BaseModel):
    workload: str
    series: list[WorkloadPoint]


class DeviceTelemetryOut(BaseModel):
    node: str
    device: int
    model: str
    virtual: bool
    utilization: float | None = Field(description="percent of the device; null: no sample")
    memory_used: int | None
    memory_total: int
    power: float | None = Field(description="watts")
    temperature: float | None = Field(description="degrees Celsius")
    source: Literal["nvml", "declared", "none"]
    workloads: list[str] = Field(
        description="workloads holding the device now, as PROJECT/NAME (of the caller's "
        "projects only, for a member)"
    )
    state: Literal["free", "busy", "idle"] = Field(
        description="free: nobody holds it; idle: held, latest samples at 0%; busy: held"
    )


class UsageRowOut(BaseModel):
    key: str
    gpu_hours_allocated: float
    gpu_hours_used: float
    gpu_hours_idle: float


# -- parameters -----------------------------------------------------------------------------


def _duration(value: Any) -> float:
    if isinstance(value, str):
        try:
            return parse_duration(float(value))
        except ValueError:
            pass
    return parse_duration(value)


Duration = Annotated[float, BeforeValidator(_duration)]
SINCE = 'how far back: seconds, or "30m", "24h", "7d"'
Until = Annotated[
    float | None,
    Query(ge=0, le=1e11, allow_inf_nan=False, description="end, in seconds since the epoch"),
]
Step = Annotated[
    float | None,
    Query(gt=0, le=366 * 86400, allow_inf_nan=False, description="seconds per point"),
]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "no token, or a token that is not valid"},
}


def _period(since: float, until: float | None) -> tuple[float, float]:
    end = time.time() if until is None else until
    return end - since, end


def _step(since: float, step: float | None) -> float:
    """The step asked for, or one that gives at most 240 points, in whole minutes."""
    if step is None:
        step = max(60.0, math.ceil(since / 240.0 / 60.0) * 60.0)
    if since / step > MAX_POINTS:
        raise RequestValidationError(
            [
                {
                    "loc": ("query", "step"),
                    "msg": f"{step:g} s gives more than {MAX_POINTS} points over {since:g} s",
                    "type": "value_error",
                }
            ]
        )
    return step


# -- the router -----------------------------------------------------------------------------


router = APIRouter(prefix=API, tags=["visibility"], responses=ERRORS, route_class=PrefixedRoute)


@router.get("/telemetry/cluster", response_model=ClusterSeriesOut)
def cluster_series(
    _: User,
    store: StoreDep,
    since: Annotated[Duration, Query(description=SINCE)] = 3600.0,
    step: Step = None,
    until: Until = None,
) -> ClusterSeriesOut:
    """GPUs registered, allocated and used over time, for the whole cluster."""
    start, end = _period(since, until)
    step = _step(since, step)
    gpus = sum(record.node.gpus for record in store.list_nodes())
    points = series(store, start, end, step)[None]
    return ClusterSeriesOut(
        since=start,
        until=end,
        step=step,
        series=[
            ClusterPoint(time=p.time, gpus=gpus, allocated=p.allocated, used=p.used) for p in points
        ],
    )


@router.get("/telemetry/queues", response_model=QueueSeriesOut)
def queue_series(
    current: User,
    store: StoreDep,
    since: Annotated[Duration, Query(description=SINCE)] = 3600.0,
    step: Step = None,
    until: Until = None,
) -> QueueSeriesOut:
    """GPUs allocated and used over time by every project and department, beside what
    each deserves; a member sees the series of their own projects only."""
    start, end = _period(since, until)
    step = _step(since, step)
    readable = readable_projects(current)
    queues = [q for q in store.list_queues() if readable is None or q.queue.name in readable]
    found = series(store, start, end, step, by="project")
    found.update(series(store, start, end, step, by="department"))
    buckets = max(1, math.ceil((end - start) / step))
    result: dict[str, list[QueuePoint]] = {}
    for record in queues:
        name = record.queue.name
        points = found.get(name)
        deserved = record.queue.deserved.gpu
        if points is None:
            result[name] = [
                QueuePoint(time=start + i * step, allocated=0.0, used=0.0, deserved=deserved)
                for i in range(buckets)
            ]
        else:
            result[name] = [
                QueuePoint(time=p.time, allocated=p.allocated, used=p.used, deserved=deserved)
                for p in points
            ]
    return QueueSeriesOut(since=start, until=end, step=step, series=result)


@router.get(
    "/telemetry/workloads/{name}",
    response_model=WorkloadSeriesOut,
    responses={404: {"model": ErrorOut, "description": "no such workload, nor samples"}},
)
def workload_series(
    name: str,
    current: User,
    store: StoreDep,
    since: Annotated[Duration, Query(description=SINCE)] = 3600.0,
    until: Until = None,
    project: ProjectQuery = None,
) -> WorkloadSeriesOut:
    """Every sample of a workload's devices: raw samples for the last 24 hours, minute
    and hour rollups further back."""
    start, end = _period(since, until)
    # The samples of a deleted workload outlive it; its project is then unknown, and a
    # member gets 404 as for any workload they may not read. Samples are kept by the
    # workload's key (PROJECT/NAME).
    key = workload_key(project, name) if project is not None and "/" not in name else name
    found: WorkloadRecord | None = None
    try:
        found = visible_workload(store, current, name, project)
    except NotFound:
        if readable_projects(current) is not None:
            raise
    if found is not None:
        key = found.name
        # Samples from before the workload was submitted are of an earlier (deleted)
        # workload of that key, and not its own.
        start = max(start, found.created_at)
    samples = workload_samples(store, key, start, end)
    if not samples and found is None:
        raise NotFound(f"workload {name!r} not found")  # one that never was
    return WorkloadSeriesOut(
        workload=short_name(key),
        series=[
            WorkloadPoint(
                time=s.time,
                node=s.node,
                device=s.device,
                task=s.task,
                utilization=s.utilization,
                memory_used=s.memory_used,
                source=s.source,
            )
            for s in samples
        ],
    )


@router.get("/telemetry/devices", response_model=list[DeviceTelemetryOut])
def devices(current: User, store: StoreDep) -> list[DeviceTelemetryOut]:
    """Every device with its latest sample and the workloads holding it (a member sees
    the names of their projects' workloads only)."""
    readable = readable_projects(current)
    shown = None if readable is None else {r.name for r in store.list_workloads(projects=readable)}
    return [
        DeviceTelemetryOut(
            node=d.node,
            device=d.device,
            model=d.model,
            virtual=d.virtual,
            utilization=d.utilization,
            memory_used=d.memory_used,
            memory_total=d.memory_total,
            power=d.power,
            temperature=d.temperature,
            source=d.source,
            workloads=d.workloads if shown is None else [w for w in d.workloads if w in shown],
            state=d.state,  # type: ignore[arg-type]
        )
        for d in now_state(store).devices
    ]


@router.get(
    "/usage",
    response_model=list[UsageRowOut],
    responses={200: {"content": {"text/csv": {}}, "description": "rows, as JSON or CSV"}},
)
def usage_report(
    current: User,
    store: StoreDep,
    since: Annotated[Duration, Query(description=SINCE)] = 7 * 86400.0,
    by: Annotated[UsageKey, Query(description="what to total by")] = "project",
    until: Until = None,
    format: Annotated[Literal["json", "csv"], Query()] = "json",
) -> Any:
    """GPU-hours allocated, used (weighted by utilisation) and idle (allocated while at
    0%), by project, department, user or workload; a member's report counts the work
    of their own projects only."""
    start, end = _period(since, until)
    rows = usage(store, start, end, by, projects=readable_projects(current))
    if format == "csv":
        return Response(usage_csv(rows), media_type="text/csv; charset=utf-8")
    return [UsageRowOut(**_row(row)) for row in rows]


def _row(row: Any) -> dict[str, Any]:
    return {
        "key": row.key,
        "gpu_hours_allocated": row.gpu_hours_allocated,
        "gpu_hours_used": row.gpu_hours_used,
        "gpu_hours_idle": row.gpu_hours_idle,
    }


def usage_csv(rows: list[Any]) -> str:
    """Usage rows as CSV with a header line."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["key", "gpu_hours_allocated", "gpu_hours_used", "gpu_hours_idle"])
    for row in rows:
        values = _row(row)
        writer.writerow([values[column] for column in values])
    return out.getvalue()


def install_visibility(app: FastAPI, store: Store, loop: Loop) -> None:
    """The telemetry and usage API, and /metrics."""
    serve(app, router)
    registry = loop.metrics.registry
    registry.register(StateCollector(store, loop))

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


__all__ = ["USAGE_KEYS", "install_visibility", "router", "usage_csv"]
