"""Bodies and helpers of a workload's life after submission: arrays expanded into their
members, dependencies checked against what the caller may read, changes to waiting work,
the history (sacct) and estimated starts (squeue --start)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from pydantic import BaseModel, Field, field_validator

from corral.api.deps import visible_workload
from corral.api.schemas.common import Body, LabelKey, LabelValue, PoolName, duration_seconds
from corral.api.schemas.workloads import WorkloadIn, distinct_pools
from corral.control import explain
from corral.model import resolve_priority
from corral.model.arrays import ArrayMember, parse_array
from corral.model.spec import WorkloadSpec, short_name, split_key, workload_key
from corral.store import Conflict, Invalid, NotFound, Store, UserRecord, WorkloadRecord
from corral.store.history import HistoryRecord

# Fields of a submission that stay as they were submitted.
FIXED = (
    "name", "project", "tasks", "min_available", "topology", "command", "env", "secrets",
    "workdir", "array", "after", "kill_on_invalid_dep", "code", "python", "image",
)  # fmt: skip


def array_specs(body: WorkloadIn, name: str, user: str) -> list[WorkloadSpec]:
    """The members of the array `name` that `body` describes, NAME-INDEX, by index (their
    keys, and the array's, PROJECT/NAME-INDEX and PROJECT/NAME)."""
    assert body.array is not None
    indices, limit = parse_array(body.array)
    spec = body.to_spec(name, user)
    return [
        replace(spec, name=f"{spec.name}-{index}", array=ArrayMember(spec.name, index, limit))
        for index in indices
    ]


def resolve_after(
    store: Store, current: UserRecord, specs: Sequence[WorkloadSpec]
) -> list[WorkloadSpec]:
    """`specs` with each workload they wait for named by its key: NAME is the workload of
    that name in the waiting workload's project, PROJECT/NAME one of another project. 422
    naming `after` when it does not exist or `current` may not read it (the same answer
    for both, so that names do not leak)."""
    together = {spec.name for spec in specs}
    resolved = []
    for spec in specs:
        after = []
        for dependency in spec.after:
            given, short = split_key(dependency.workload)
            key = workload_key(given or spec.project, short)
            if key not in together:  # one submitted in the same request: the store checks
                try:
                    key = visible_workload(store, current, short, given or spec.project).name
                except (NotFound, Conflict):
                    raise Invalid(
                        "after", f"no workload {dependency.workload!r} to wait for"
                    ) from None
            after.append(replace(dependency, workload=key))
        resolved.append(replace(spec, after=tuple(after)) if spec.after else spec)
    return resolved


def _fixed(value: Any) -> Any:
    raise ValueError("cannot change after submission; cancel the workload and submit it again")


class WorkloadPatch(Body):
    """Fields of a pending or suspended workload to change; a field left out stays."""

    priority: str | int | None = None
    preemptible: bool | None = None
    max_runtime: float | str | None = None
    backoff_limit: int | None = Field(None, ge=0, le=100)
    grace_period: float | str | None = None
    node_selector: dict[LabelKey, LabelValue | list[LabelValue]] | None = Field(None, max_length=32)
    node_pools: list[PoolName] | None = Field(
        None,
        max_length=16,
        description="node pools it may run in, in order of preference; empty or null: any",
    )
    # Fields that never change: named, so that the answer says why.
    name: Any = None
    project: Any = None
    tasks: Any = None
    min_available: Any = None
    topology: Any = None
    command: Any = None
    env: Any = None
    secrets: Any = None
    workdir: Any = None
    array: Any = None
    after: Any = None
    kill_on_invalid_dep: Any = None
    code: Any = None
    python: Any = None
    image: Any = None

    @field_validator(*FIXED, mode="before")
    @classmethod
    def _never(cls, value: Any) -> Any:
        return _fixed(value)

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: str | int | None) -> str | int | None:
        if value is not None and abs(resolve_priority(value)) > 1_000_000:
            raise ValueError("must be between -1000000 and 1000000")
        return value

    @field_validator("node_pools")
    @classmethod
    def _node_pools(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else distinct_pools(value)

    @field_validator("max_runtime", "grace_period")
    @classmethod
    def _duration(cls, value: float | str | None) -> float | str | None:
        if value is not None and not (value == 0 and not isinstance(value, str)):
            duration_seconds(value)
        return value

    def changes(self) -> dict[str, Any]:
        """The store's column values of the fields given."""
        given = self.model_fields_set
        changes: dict[str, Any] = {}
        if "priority" in given and self.priority is not None:
            changes["priority"] = resolve_priority(self.priority)
        if "preemptible" in given and self.preemptible is not None:
            changes["preemptible"] = self.preemptible
        if "max_runtime" in given:
            value = self.max_runtime
            changes["max_runtime"] = None if value is None else duration_seconds(value)
        if "backoff_limit" in given and self.backoff_limit is not None:
            changes["backoff_limit"] = self.backoff_limit
        if "grace_period" in given and self.grace_period is not None:
            grace = self.grace_period
            changes["grace_period"] = 0.0 if grace == 0 else duration_seconds(grace)
        if "node_selector" in given:
            changes["node_selector"] = {
                key: values if isinstance(values, list) else [values]
                for key, values in (self.node_selector or {}).items()
            }
        if "node_pools" in given:
            changes["node_pools"] = list(self.node_pools or [])
        if not changes:
            raise Invalid("body", "give at least one field to change")
        return changes

    def changed(self, spec: WorkloadSpec) -> WorkloadSpec:
        """`spec` with the placement fields this patch changes (what the never-fits
        check needs to see again)."""
        given = self.model_fields_set
        if "node_selector" in given:
            selector = {
                key: tuple(values) if isinstance(values, list) else (values,)
                for key, values in (self.node_selector or {}).items()
            }
            spec = replace(spec, node_selector=selector)
        if "node_pools" in given:
            spec = replace(spec, node_pools=tuple(self.node_pools or ()))
        return spec


class HistoryOut(BaseModel):
    """A workload as history shows it (like a line of sacct)."""

    name: str
    project: str
    user: str
    state: str
    priority: int
    gpus: float = Field(description="GPUs asked for: whole devices and fractions, all tasks")
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    wait_seconds: float | None = Field(description="from submission to first start (so far)")
    run_seconds: float | None = Field(description="from first start to the end (so far)")
    gpu_hours: float = Field(description="GPUs held times hours held, every run")
    exit_code: int | None
    attempts: int
    evictions: int
    reason: str | None
    cancelled_by: str | None
    array: str | None
    array_index: int | None


def history_out(found: HistoryRecord, now: float) -> HistoryOut:
    """A history line; times still running are counted to `now`."""
    record = found.workload
    spec = record.spec
    started, finished = record.started_at, record.finished_at
    if started is not None:
        wait: float | None = started - record.created_at
    elif finished is None:
        wait = now - record.created_at
    else:
        wait = None
    run = None if started is None else (finished if finished is not None else now) - started
    return HistoryOut(
        name=short_name(spec.name),
        project=spec.project,
        user=spec.user,
        state=record.status,
        priority=spec.priority,
        gpus=round(sum(g.gpu * g.replicas for g in spec.task_groups), 6),
        submitted_at=record.created_at,
        started_at=started,
        finished_at=finished,
        wait_seconds=None if wait is None else round(max(wait, 0.0), 3),
        run_seconds=None if run is None else round(max(run, 0.0), 3),
        gpu_hours=round(found.gpu_seconds / 3600, 6),
        exit_code=record.exit_code,
        attempts=record.attempts,
        evictions=found.evictions,
        reason=record.reason,
        cancelled_by=record.cancelled_by,
        array=short_name(spec.array.name) if spec.array else None,
        array_index=spec.array.index if spec.array else None,
    )


class StartOut(BaseModel):
    workload: str
    project: str
    estimated_start: float | None = Field(
        description="seconds since the epoch; null when it cannot be known"
    )
    why: str = Field(description="what the estimate rests on")


def estimated_starts(store: Store, pending: list[WorkloadRecord]) -> list[StartOut]:
    """An estimated start for each pending workload (`control.explain.estimated_starts`)."""
    return [StartOut(**asdict(start)) for start in explain.estimated_starts(store, pending)]
