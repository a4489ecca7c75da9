"""The Philly job table of the Pollux artifact (`pollux-osdi21/traces/philly.csv`).

Columns: `timestamp` (submission, "YYYY-MM-DD HH:MM:SS"), `duration` (s), `num_gpus` and
`cluster` (the virtual cluster, which becomes the project). Every job is preemptible
training. A job wider than one node is a gang of whole-node tasks plus one task with the
rest, so that a 12-GPU job on 8-GPU nodes is one 8-GPU task and one 4-GPU task.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from corral.model import PRIORITY_CLASSES, TaskGroup
from corral.sim.errors import SimError
from corral.sim.loaders.csvfile import read_rows
from corral.sim.trace import Job, Trace

COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
TRAIN = PRIORITY_CLASSES["train"]


def gang_shape(gpus: int, gpus_per_node: int) -> tuple[TaskGroup, ...]:
    """Task groups for a job of `gpus` whole GPUs on nodes of `gpus_per_node`."""
    if gpus <= gpus_per_node:
        return (TaskGroup(replicas=1, gpu=float(gpus)),)
    whole, rest = divmod(gpus, gpus_per_node)
    groups = [TaskGroup(name="node", replicas=whole, gpu=float(gpus_per_node))]
    if rest:
        groups.append(TaskGroup(name="rest", replicas=1, gpu=float(rest)))
    return tuple(groups)


def load_philly(path: Path, gpus_per_node: int = 8) -> Trace:
    """Read the Philly job table; submission times count from the first submission."""
    raw: list[tuple[datetime, float, int, str, int]] = []
    for index, row in enumerate(read_rows(path, COLUMNS)):
        text = row.text("timestamp")
        try:
            submitted = datetime.fromisoformat(text)
        except ValueError:
            raise row.error("timestamp", f"{text!r} is not a date and time") from None
        duration = row.number("duration")
        gpus = row.number("num_gpus")
        if gpus < 1 or gpus != int(gpus):
            raise row.error("num_gpus", f"{gpus:g} is not a whole number of GPUs")
        project = row.text("cluster")
        if not project:
            raise row.error("cluster", "is empty")
        raw.append((submitted, duration, int(gpus), project, index))
    if not raw:
        raise SimError(path.name, "the file has no jobs")
    first = min(item[0] for item in raw)
    jobs = []
    # Ties in submission time keep the file's order.
    for submitted, duration, gpus, project, index in sorted(
        raw, key=lambda item: (item[0], item[4])
    ):
        if duration <= 0:
            continue
        jobs.append(
            Job(
                name=f"philly-{index:05d}",
                project=project,
                submitted=(submitted - first).total_seconds(),
                duration=duration,
                task_groups=gang_shape(gpus, gpus_per_node),
                priority=TRAIN,
            )
        )
    span = max(job.submitted for job in jobs)
    return Trace("philly", str(path), tuple(jobs), span, start=first.isoformat(sep=" "))
