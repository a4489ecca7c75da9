"""The Philly-derived per-VC traces of Gavel (`gavel-osdi20/traces/msr/seed_0/<vc>.trace`).

Each file is one virtual cluster (the project), tab-separated without a header: job type,
command, steps flag, needs-data flag, total steps, arrival time (s) and scale factor
(GPUs). A job's duration is its total steps over its measured throughput on one worker
type (`simulation_throughputs.json`, V100 by default) at its scale factor. Throughputs are
measured for 1, 2, 4 and 8 GPUs and not for every job type at every scale: a job uses
the largest measured scale not above its own and scales that throughput linearly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from corral.model import PRIORITY_CLASSES
from corral.sim.errors import SimError
from corral.sim.loaders.philly import gang_shape
from corral.sim.trace import Job, Trace

FIELDS = (
    "job type",
    "command",
    "steps flag",
    "needs data",
    "total steps",
    "arrival time",
    "scale factor",
)
THROUGHPUTS = "simulation_throughputs.json"
TRAIN = PRIORITY_CLASSES["train"]

Throughputs = dict[str, dict[int, float]]


def load_throughputs(path: Path, worker: str) -> Throughputs:
    """Steps per second of each job type at each measured scale factor, on `worker`."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SimError(str(path), "no such file") from None
    except json.JSONDecodeError as error:
        raise SimError(path.name, f"not JSON: {error.msg} at line {error.lineno}") from None
    if worker not in document:
        raise SimError(path.name, f"no throughputs for worker type {worker!r}")
    table: Throughputs = {}
    for key, measured in document[worker].items():
        # Keys look like "('ResNet-50 (batch size 128)', 4)".
        name, _, scale = key.strip("()").rpartition(", ")
        alone = measured.get("null") if isinstance(measured, dict) else None
        if not isinstance(alone, int | float) or alone <= 0:
            continue
        table.setdefault(name.strip("'\""), {})[int(scale)] = float(alone)
    return table


def job_seconds(table: Throughputs, job_type: str, steps: float, scale: int) -> float | None:
    """Seconds to run `steps` of `job_type` on `scale` GPUs, or None if never measured."""
    measured = table.get(job_type)
    if not measured:
        return None
    usable = [known for known in measured if known <= scale] or [min(measured)]
    base = max(usable)
    return steps / (measured[base] * scale / base)


def load_gavel(path: Path, throughputs: Path | None = None, worker: str = "v100") -> Trace:
    """Read one `.trace` file, or every `.trace` file of a directory (one VC each)."""
    if path.is_dir():
        files = sorted(path.glob("*.trace"))
        if not files:
            raise SimError(str(path), "no .trace files in the directory")
    elif path.is_file():
        files = [path]
    else:
        raise SimError(str(path), "no such file or directory")
    table_path = throughputs or _find_throughputs(path)
    table = load_throughputs(table_path, worker)
    jobs: list[Job] = []
    for file in files:
        jobs.extend(_read_vc(file, table))
    jobs.sort(key=lambda job: (job.submitted, job.name))
    span = max((job.submitted for job in jobs), default=0.0)
    return Trace("gavel", str(path), tuple(jobs), span)


def _find_throughputs(path: Path) -> Path:
    for folder in (path if path.is_dir() else path.parent, *path.parents):
        candidate = folder / THROUGHPUTS
        if candidate.is_file():
            return candidate
    raise SimError(str(path), f"no {THROUGHPUTS} found in this folder or above")


def _read_vc(file: Path, table: Throughputs) -> list[Job]:
    project = file.stem
    jobs = []
    for line_number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < len(FIELDS):
            missing = FIELDS[len(parts)]
            raise SimError(
                file.name,
                f"field {len(parts) + 1} ({missing}) is absent: "
                f"a line needs {len(FIELDS)} tab-separated fields",
                f"line {line_number}",
            )
        job_type = parts[0]
        steps = _number(parts[4], file, line_number, "total steps")
        arrival = _number(parts[5], file, line_number, "arrival time")
        scale = _number(parts[6], file, line_number, "scale factor")
        if scale < 1 or scale != int(scale):
            raise SimError(
                file.name, f"{parts[6]!r} is not a whole number of GPUs", f"line {line_number}"
            )
        seconds = job_seconds(table, job_type, steps, int(scale))
        if seconds is None:
            raise SimError(
                file.name,
                f"no measured throughput for job type {job_type!r}",
                f"line {line_number}",
            )
        jobs.append(
            Job(
                name=f"{project}-{line_number:05d}",
                project=project,
                submitted=arrival,
                duration=seconds,
                task_groups=gang_shape(int(scale), 8),
                priority=TRAIN,
            )
        )
    return jobs


def _number(text: str, file: Path, line: int, field: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SimError(file.name, f"{field} {text!r} is not a number", f"line {line}") from None
    if not math.isfinite(value):
        raise SimError(file.name, f"{field} {text!r} is not a finite number", f"line {line}")
    return value
