"""Lost work: GPU-hours thrown away by preemption with newest-first victims against
checkpoint-aware victims, on the Philly job table.

    python benchmarks/lost_work.py [--gpus 752] [--interval 60] [--days D] [--json]

The pooling study's setup (benchmarks/pooling.py): Philly's 15 virtual clusters are
projects whose deserved quotas are their shares of the cluster in proportion to mean
demand; nodes of 8 GPUs; cycles every 60 s that allocate, consolidate and reclaim. At
752 GPUs (2x the mean demand, where corral's p95 wait is under 2 hours and reclaim is
busy) it replays the trace twice:

- newest first: the engine knows nothing of checkpoints and takes the newest victims;
- checkpoint-aware: before each cycle the simulator tells the engine each running job's
  seconds of work since its last checkpoint, and among victims of equal priority the
  engine takes those that lose the fewest GPU-seconds.

The checkpoint model is synthetic and stated: every job checkpoints after each 30
minutes of progress, an evicted job keeps the progress of its last checkpoint and pays
60 s to restart. Lost work is what evictions throw away (progress since the last
checkpoint, times the job's GPUs). Goal: at least 30% less lost work, p95 wait no worse.

With --json the last line is one JSON object with `lost_gpu_hours_newest_first`,
`lost_gpu_hours_checkpoint_aware`, `p95_wait_h_newest_first`,
`p95_wait_h_checkpoint_aware` and the evictions of each.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from bench_support import table, traces_dir
from corral.model import SchedulerConfig
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
CHECKPOINT_SECONDS = 1800.0
RESTART_SECONDS = 60.0


def replay(gpus: int, checkpoint_aware: bool, interval: float, days: float | None) -> SimResult:
    """One replay of Philly on `gpus` GPUs; the trace cut to its first `days` if given."""
    trace = load_trace("philly", root=traces_dir())
    if days is not None:
        cut = sum(1 for job in trace.jobs if job.submitted - trace.jobs[0].submitted < days * 86400)
        trace = trace.head(cut)
    weights = trace.mean_demand()
    nodes = uniform_nodes(gpus, GPUS_PER_NODE)
    total = sum(node.gpus for node in nodes)
    config = SchedulerConfig(actions=("allocate", "consolidate", "reclaim"))
    cluster = Cluster(f"{total} GPUs", nodes, project_queues(apportion(total, weights)), config)
    settings = SimSettings(
        cycle_interval=interval,
        checkpoint_interval=CHECKPOINT_SECONDS,
        restart_cost=RESTART_SECONDS,
        checkpoint_aware=checkpoint_aware,
    )
    return Simulation(prepare("corral", cluster), trace, cluster.quotas(), settings).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=752)
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--days", type=float, default=None, help="only the first DAYS of jobs")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    results: dict[str, SimResult] = {}
    seconds: dict[str, float] = {}
    for name, aware in (("newest_first", False), ("checkpoint_aware", True)):
        began = time.process_time()
        results[name] = replay(args.gpus, aware, args.interval, args.days)
        seconds[name] = time.process_time() - began
    rows = []
    for name, result in results.items():
        p95 = result.queueing_delay.p95 or 0.0
        rows.append(
            [
                name.replace("_", " "),
                f"{result.preemptions:,}",
                f"{result.lost_gpu_hours:,.0f}",
                f"{p95 / HOUR:.2f}",
                f"{(result.queueing_delay.mean or 0.0) / HOUR:.2f}",
                f"{seconds[name]:.0f}",
            ]
        )
    print(f"Philly on {args.gpus} GPUs, checkpoints every 30 min, restart 60 s\n")
    print(
        table(
            ["victims", "evictions", "lost GPU-h", "p95 wait h", "mean wait h", "CPU s"],
            rows,
        )
    )
    newest, aware = results["newest_first"], results["checkpoint_aware"]
    saved = (
        1 - aware.lost_gpu_hours / newest.lost_gpu_hours if newest.lost_gpu_hours > 0 else math.nan
    )
    print(f"\ncheckpoint-aware victims lose {saved:.0%} less work (goal: at least 30%)")
    if args.json:
        print(
            json.dumps(
                {
                    "lost_gpu_hours_newest_first": round(newest.lost_gpu_hours, 1),
                    "lost_gpu_hours_checkpoint_aware": round(aware.lost_gpu_hours, 1),
                    "p95_wait_h_newest_first": round((newest.queueing_delay.p95 or 0) / HOUR, 3),
                    "p95_wait_h_checkpoint_aware": round((aware.queueing_delay.p95 or 0) / HOUR, 3),
                    "evictions_newest_first": newest.preemptions,
                    "evictions_checkpoint_aware": aware.preemptions,
                }
            )
        )


if __name__ == "__main__":
    main()
