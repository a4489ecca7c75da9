"""Backfill with reservations: the wait of large gangs on the Philly job table, with and
without reservations, and what the reservations cost in allocation.

    python benchmarks/backfill.py [--gpus 752] [--interval 60] [--reserve-after 1h]
                                  [--runtime-factor 1] [--days D] [--json]

The pooling study's setup (benchmarks/pooling.py): Philly's 15 virtual clusters are
projects whose deserved quotas are their shares of the cluster in proportion to mean
demand; nodes of 8 GPUs; cycles every 60 s that allocate, consolidate and reclaim. The
trace is replayed twice:

- off: no queue sets `reserve_after` (today's behaviour);
- on: every project sets `reserve_after` (1 hour by default): a job that has waited that
  long at the head of its project gets a reservation of the nodes where it fits soonest.

The runtime model is stated: each job's max runtime is its duration in the trace times
`--runtime-factor` (1: users know exactly how long their jobs run, as backfill studies
assume at best; 2 or more: the generous limits users give in practice), counted from each
start. The engine plans reservations with these max runtimes; jobs still end when their
work is done. Both replays get the same max runtimes, so only reservations differ.

Large jobs are those of 8 GPUs or more. Their wait is from submission to first start (to
the end of the run for a job that never started). Allocation is the share of the GPUs'
time held by jobs over the trace's window, the cost of holding nodes empty while they
drain.

With --json the last line is one JSON object with `large_p95_wait_h_off`,
`large_p95_wait_h_on`, `large_max_wait_h_off`, `large_max_wait_h_on`, `utilisation_off`,
`utilisation_on` (allocation, as a fraction), and the p95 wait of all jobs.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from bench_support import table, traces_dir
from corral.model import SchedulerConfig
from corral.model.durations import parse_duration
from corral.sim import (
    Cluster,
    SimResult,
    SimSettings,
    Simulation,
    apportion,
    load_trace,
    prepare,
    project_queues,
    uniform_nodes,
)

HOUR = 3600.0
GPUS_PER_NODE = 8
LARGE = 8


@dataclass(frozen=True, slots=True)
class Replay:
    """One replay's figures."""

    result: SimResult
    large_jobs: int
    large_p95_h: float
    large_max_h: float
    large_mean_h: float
    cpu_seconds: float


def replay(args: argparse.Namespace, reserve_after: float | None) -> Replay:
    """One replay of Philly; every project reserves after `reserve_after` (None: off)."""
    began = time.process_time()
    trace = load_trace("philly", root=traces_dir())
    if args.days is not None:
        first = trace.jobs[0].submitted
        cut = sum(1 for job in trace.jobs if job.submitted - first < args.days * 86400)
        trace = trace.head(cut)
    weights = trace.mean_demand()
    nodes = uniform_nodes(args.gpus, GPUS_PER_NODE)
    total = sum(node.gpus for node in nodes)
    queues = tuple(
        replace(queue, reserve_after=reserve_after)
        for queue in project_queues(apportion(total, weights))
    )
    config = SchedulerConfig(actions=("allocate", "consolidate", "reclaim"))
    cluster = Cluster(f"{total} GPUs", nodes, queues, config)
    settings = SimSettings(cycle_interval=args.interval, max_runtime_factor=args.runtime_factor)
    simulation = Simulation(prepare("corral", cluster), trace, cluster.quotas(), settings)
    result = simulation.run()
    waits = []
    for state in simulation.jobs:
        if state.job.gpus < LARGE or state.job.submitted > result.end:
            continue
        start = state.first_start if not math.isnan(state.first_start) else result.end
        waits.append(start - state.job.submitted)
    large = np.array(waits) if waits else np.zeros(1)
    return Replay(
        result=result,
        large_jobs=len(waits),
        large_p95_h=float(np.percentile(large, 95)) / HOUR,
        large_max_h=float(large.max()) / HOUR,
        large_mean_h=float(large.mean()) / HOUR,
        cpu_seconds=time.process_time() - began,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=752)
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--reserve-after", default="1h", help="a duration such as 30m or 2h")
    parser.add_argument("--runtime-factor", type=float, default=1.0)
    parser.add_argument("--days", type=float, default=None, help="only the first DAYS of jobs")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    reserve_after = parse_duration(args.reserve_after)
    runs = {"off": replay(args, None), "on": replay(args, reserve_after)}
    rows = []
    for name, run in runs.items():
        result = run.result
        rows.append(
            [
                name,
                f"{run.large_jobs:,}",
                f"{run.large_p95_h:.2f}",
                f"{run.large_max_h:.1f}",
                f"{run.large_mean_h:.2f}",
                f"{(result.queueing_delay.p95 or 0.0) / HOUR:.2f}",
                f"{result.allocation:.2%}",
                f"{result.preemptions:,}",
                f"{run.cpu_seconds:.0f}",
            ]
        )
    print(
        f"Philly on {args.gpus} GPUs, reserve after {args.reserve_after}, "
        f"max runtime = duration x {args.runtime_factor:g}\n"
    )
    header = ["reservations", "jobs 8+ GPUs", "p95 wait h", "max wait h", "mean wait h"]
    header += ["all p95 h", "allocation", "evictions", "CPU s"]
    print(table(header, rows))
    if args.json:
        off, on = runs["off"], runs["on"]
        print(
            json.dumps(
                {
                    "large_p95_wait_h_off": round(off.large_p95_h, 3),
                    "large_p95_wait_h_on": round(on.large_p95_h, 3),
                    "large_max_wait_h_off": round(off.large_max_h, 3),
                    "large_max_wait_h_on": round(on.large_max_h, 3),
                    "utilisation_off": round(off.result.allocation, 4),
                    "utilisation_on": round(on.result.allocation, 4),
                    "p95_wait_h_off": round((off.result.queueing_delay.p95 or 0) / HOUR, 3),
                    "p95_wait_h_on": round((on.result.queueing_delay.p95 or 0) / HOUR, 3),
                    "cpu_seconds": round(off.cpu_seconds + on.cpu_seconds, 1),
                }
            )
        )


if __name__ == "__main__":
    main()
