"""A seeded synthetic workload: Poisson arrivals per project, with bursts, of interactive,
training and distributed jobs.

The default mix is four projects on a 64-GPU cluster, each with its own quota, rate and
bursts: enough contention that quotas, borrowing and reclaim all matter.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from corral.model import PRIORITY_CLASSES, TaskGroup
from corral.sim.trace import Job, Trace

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of job: its shapes (GPUs per task, tasks) drawn uniformly, its median length
    and spread (log-normal, capped), priority, preemptibility and GPU utilisation range."""

    name: str
    shapes: tuple[tuple[float, int], ...]
    median_hours: float
    sigma: float
    max_hours: float
    priority: int
    preemptible: bool
    utilisation: tuple[float, float]


INTERACTIVE = Kind(
    "interactive",
    shapes=((0.25, 1), (0.5, 1), (1.0, 1)),
    median_hours=0.5,
    sigma=0.8,
    max_hours=8.0,
    priority=PRIORITY_CLASSES["interactive"],
    preemptible=False,
    utilisation=(0.05, 0.35),
)
TRAINING = Kind(
    "training",
    shapes=((1.0, 1), (2.0, 1), (4.0, 1), (8.0, 1)),
    median_hours=2.0,
    sigma=1.0,
    max_hours=48.0,
    priority=PRIORITY_CLASSES["train"],
    preemptible=True,
    utilisation=(0.6, 0.95),
)
DISTRIBUTED = Kind(
    "distributed",
    shapes=((8.0, 2), (8.0, 4)),
    median_hours=4.0,
    sigma=0.8,
    max_hours=48.0,
    priority=PRIORITY_CLASSES["train"],
    preemptible=True,
    utilisation=(0.7, 0.95),
)


@dataclass(frozen=True, slots=True)
class ProjectLoad:
    """One project's arrivals: `rate` jobs per hour, the share of each kind, a GPU quota,
    and bursts: every `burst_every` hours the rate is multiplied by `burst_factor` for
    `burst_hours` (starting at a random phase)."""

    name: str
    quota: float
    rate: float
    interactive: float
    training: float
    distributed: float
    burst_every: float = 24.0
    burst_hours: float = 0.0
    burst_factor: float = 1.0


DEFAULT_PROJECTS = (
    ProjectLoad("team-a", 24, 0.6, 0.2, 0.7, 0.1, burst_every=24, burst_hours=6, burst_factor=3),
    ProjectLoad("team-b", 16, 3.0, 0.8, 0.2, 0.0, burst_every=24, burst_hours=8, burst_factor=2),
    ProjectLoad("team-c", 16, 0.07, 0.0, 0.3, 0.7, burst_every=48, burst_hours=12, burst_factor=4),
    ProjectLoad("team-d", 8, 0.8, 0.5, 0.5, 0.0),
)


def synthetic_trace(
    seed: int = 0, hours: float = 72.0, projects: tuple[ProjectLoad, ...] = DEFAULT_PROJECTS
) -> Trace:
    """Jobs submitted over `hours`, the same for the same seed."""
    rng = random.Random(seed)
    span = hours * HOUR
    raw: list[tuple[float, str, Kind, random.Random]] = []
    for project in projects:
        # One stream per project, so that changing one project leaves the others as they were.
        stream = random.Random(rng.random())
        for submitted in _arrivals(stream, project, span):
            kind = _kind(stream, project)
            raw.append((submitted, project.name, kind, random.Random(stream.random())))
    raw.sort(key=lambda item: (item[0], item[1]))
    jobs = tuple(
        _job(index, submitted, project, kind, draw)
        for index, (submitted, project, kind, draw) in enumerate(raw)
    )
    quotas = {project.name: project.quota for project in projects}
    return Trace("synthetic", f"synthetic(seed={seed}, hours={hours:g})", jobs, span, quotas=quotas)


def _arrivals(rng: random.Random, project: ProjectLoad, span: float) -> list[float]:
    """Poisson arrivals at a rate that rises during bursts (by thinning a faster stream)."""
    if project.rate <= 0:
        return []
    peak = project.rate * max(project.burst_factor, 1.0) / HOUR
    phase = rng.uniform(0, project.burst_every * HOUR)
    times = []
    now = rng.expovariate(peak)
    while now < span:
        if rng.random() * peak <= _rate(project, now, phase):
            times.append(now)
        now += rng.expovariate(peak)
    return times


def _rate(project: ProjectLoad, now: float, phase: float) -> float:
    position = (now + phase) % (project.burst_every * HOUR)
    bursting = position < project.burst_hours * HOUR
    return project.rate * (project.burst_factor if bursting else 1.0) / HOUR


def _kind(rng: random.Random, project: ProjectLoad) -> Kind:
    pick = rng.random() * (project.interactive + project.training + project.distributed)
    if pick < project.interactive:
        return INTERACTIVE
    if pick < project.interactive + project.training:
        return TRAINING
    return DISTRIBUTED


def _job(index: int, submitted: float, project: str, kind: Kind, rng: random.Random) -> Job:
    gpu, replicas = rng.choice(kind.shapes)
    hours = min(kind.median_hours * math.exp(rng.gauss(0.0, kind.sigma)), kind.max_hours)
    low, high = kind.utilisation
    return Job(
        name=f"{project}-{kind.name}-{index:05d}",
        project=project,
        submitted=submitted,
        duration=max(hours * HOUR, 60.0),
        task_groups=(TaskGroup(replicas=replicas, gpu=gpu),),
        priority=kind.priority,
        preemptible=kind.preemptible,
        utilisation=rng.uniform(low, high),
    )
