"""Helios per-VC demand series (`helios-sc21/earth_vc_sequences/<vc>.csv`).

Each file holds one virtual cluster of SenseTime's Earth cluster, minute by minute over
May 2020: its GPUs (`total_gpu_num`, the VC's quota), GPUs held by running jobs and GPUs
asked for by pending jobs, also split into jobs of at least 8 GPUs (`*_noless_8`).

The series has no job records, so jobs are rebuilt from the demand (running + pending
GPUs) as layers: when demand rises, new jobs start at the top of a stack; when it falls,
the newest jobs end. Demand from jobs of 8 or more GPUs becomes 8-GPU jobs, the rest
1-GPU jobs. Replayed without any limit, these jobs reproduce the demand series exactly.
A job lasts as long as its layer of demand did, which includes the time it waited in
the original cluster: its length is an upper bound on its real run time.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from corral.model import PRIORITY_CLASSES, TaskGroup
from corral.sim.errors import SimError
from corral.sim.loaders.csvfile import read_rows
from corral.sim.trace import Job, Trace

COLUMNS = (
    "time",
    "total_gpu_num",
    "running_gpu_num",
    "pending_gpu_num",
    "running_gpu_num_noless_8",
    "pending_gpu_num_noless_8",
)
SEQUENCES = "earth_vc_sequences"
MINUTE = 60.0
BLOCK = 8
TRAIN = PRIORITY_CLASSES["train"]


def load_helios(path: Path) -> Trace:
    """Read one VC's sequence file, or every sequence file of a directory (or of its
    `earth_vc_sequences` subdirectory)."""
    if path.is_dir():
        folder = path / SEQUENCES if (path / SEQUENCES).is_dir() else path
        files = sorted(folder.glob("*.csv"))
        if not files:
            raise SimError(str(path), "no sequence files (*.csv) in the directory")
    elif path.is_file():
        files = [path]
    else:
        raise SimError(str(path), "no such file or directory")
    jobs: list[Job] = []
    quotas: dict[str, float] = {}
    span = 0.0
    start: str | None = None
    for file in files:
        vc_jobs, quota, minutes, first = _read_vc(file)
        jobs.extend(vc_jobs)
        quotas[file.stem] = quota
        span = max(span, minutes * MINUTE)
        start = start or first
    jobs.sort(key=lambda job: (job.submitted, job.name))
    return Trace("helios", str(path), tuple(jobs), span, quotas=quotas, start=start)


def _read_vc(file: Path) -> tuple[list[Job], float, int, str]:
    quota_counts: Counter[float] = Counter()
    blocks: list[int] = []
    singles: list[int] = []
    first = ""
    for row in read_rows(file, COLUMNS):
        first = first or row.text("time")
        quota_counts[row.number("total_gpu_num")] += 1
        demand = row.number("running_gpu_num") + row.number("pending_gpu_num")
        large = row.number("running_gpu_num_noless_8") + row.number("pending_gpu_num_noless_8")
        count = int(large) // BLOCK
        blocks.append(count)
        singles.append(max(int(demand) - count * BLOCK, 0))
    if not blocks:
        raise SimError(file.name, "the file has no rows")
    layers = [(begin, end, BLOCK) for begin, end in _layers(blocks)]
    layers += [(begin, end, 1) for begin, end in _layers(singles)]
    layers.sort()
    vc = file.stem
    jobs = [
        Job(
            name=f"{vc}-{number:06d}",
            project=vc,
            submitted=begin * MINUTE,
            duration=(end - begin) * MINUTE,
            task_groups=(TaskGroup(gpu=float(gpus)),),
            priority=TRAIN,
        )
        for number, (begin, end, gpus) in enumerate(layers)
    ]
    quota = quota_counts.most_common(1)[0][0]
    return jobs, quota, len(blocks), first


def _layers(series: list[int]) -> list[tuple[int, int]]:
    """(first minute, minute after the last) of each unit of a demand series, stacked:
    a rise opens units on top, a fall closes the newest ones."""
    stack: list[int] = []
    layers: list[tuple[int, int]] = []
    for minute, level in enumerate(series):
        while len(stack) > level:
            layers.append((stack.pop(), minute))
        stack.extend([minute] * (level - len(stack)))
    layers.extend((begin, len(series)) for begin in stack)
    return layers
