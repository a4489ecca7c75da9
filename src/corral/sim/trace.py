"""What the simulator replays: jobs with a submission time and a length of work, grouped
into projects, and (for some traces) the cluster they ran on."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.model import DEFAULT_PRIORITY, Node, TaskGroup

TRACES_ENV = "CORRAL_TRACES"


def traces_root() -> Path:
    """Where the shared traces live: $CORRAL_TRACES, else `../shared/traces` beside the
    repository this package was loaded from."""
    configured = os.environ.get(TRACES_ENV)
    if configured:
        return Path(configured)
    # src/corral/sim/trace.py -> the repository is three levels above `corral`.
    return Path(__file__).resolve().parents[3].parent / "shared" / "traces"


@dataclass(frozen=True, slots=True)
class Job:
    """One job of a trace.

    `submitted` and `duration` are seconds: the submission time from the trace's start,
    and the work the job does when it runs undisturbed. All tasks start together (a gang).
    `utilisation` is the share of its GPUs' time the job keeps busy, when the trace says.
    """

    name: str
    project: str
    submitted: float
    duration: float
    task_groups: tuple[TaskGroup, ...]
    priority: int = DEFAULT_PRIORITY
    preemptible: bool = True
    gpu_models: tuple[str, ...] = ()
    utilisation: float | None = None

    @property
    def gpus(self) -> float:
        """GPUs the job holds while it runs (fractions count as their share)."""
        return sum(group.gpu * group.replicas for group in self.task_groups)


@dataclass(frozen=True, slots=True)
class Trace:
    """Jobs in submission order, over a window of `span` seconds from the trace's start.

    `nodes` is the cluster the trace describes, if it describes one; `quotas` the GPU quota
    of each project, if the trace gives them; `start` the wall-clock start (ISO 8601).
    """

    name: str
    source: str
    jobs: tuple[Job, ...]
    span: float
    nodes: tuple[Node, ...] = ()
    quotas: Mapping[str, float] = field(default_factory=dict)
    start: str | None = None

    @property
    def projects(self) -> tuple[str, ...]:
        """Every project with a job, sorted by name."""
        return tuple(sorted({job.project for job in self.jobs}))

    def gpu_seconds(self) -> dict[str, float]:
        """GPU-seconds of work each project submits, sorted by project name."""
        totals = dict.fromkeys(self.projects, 0.0)
        for job in self.jobs:
            totals[job.project] += job.gpus * job.duration
        return totals

    def mean_demand(self) -> dict[str, float]:
        """Each project's mean GPU demand: its GPU-seconds over the trace's span."""
        span = self.span if self.span > 0 else 1.0
        return {project: seconds / span for project, seconds in self.gpu_seconds().items()}

    def head(self, count: int) -> Trace:
        """The first `count` jobs, with the span cut to the last of their submissions."""
        jobs = self.jobs[:count]
        span = max((job.submitted for job in jobs), default=0.0)
        return Trace(self.name, self.source, jobs, span, self.nodes, self.quotas, self.start)
