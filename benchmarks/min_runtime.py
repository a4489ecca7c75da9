"""Min-runtime: evictions and GPU-hours of work lost with and without a 10-minute
reclaim min-runtime, on the Helios demand series.

    python benchmarks/min_runtime.py [--gpus 488] [--days D] [--min-runtime 600] [--json]

Helios (`helios-sc21`, five VCs of SenseTime's Earth cluster, May 2020): each VC is a
project whose deserved quota is its GPUs (488 in all), and its per-minute demand
(running + pending GPUs) becomes jobs (`corral.sim.loaders.helios`: 8-GPU jobs for the
demand of large jobs, 1-GPU jobs for the rest). The cluster is the VCs' own 488 GPUs in
nodes of 8, the default: there the VCs borrow each other's idle quota and reclaim it
when their own demand rises, minute by minute, which is where reclaims chase each other.
Cycles every 60 s allocate, consolidate and reclaim (every job has the same priority).

It replays the trace without a min-runtime and with `reclaim_min_runtime` on every queue
(10 minutes by default: a job that has run less since it last started is no victim of
reclaim), each twice: with the victims that ran least since they started (what a server
knows without checkpoint reports: the engine is told how long each job has run) and with
checkpoint-aware victims (it is also told each job's work since its last checkpoint).
Jobs checkpoint after every 30 minutes of progress and pay 60 s to restart (as in
benchmarks/lost_work.py); lost work is the progress evictions throw away times the job's
GPUs. Evictions count reclaims and consolidation's moves (a move restarts a job too).

Without the shared traces (../shared/traces, or $CORRAL_TRACES) it says so and exits 0.
With --json the last line is one JSON object with at least `evictions_off`,
`evictions_on`, `lost_gpu_hours_off` and `lost_gpu_hours_on`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from bench_support import REPO, table
from corral.model import SchedulerConfig
from corral.sim import (
    Cluster,
    SimResult,
    SimSettings,
    Simulation,
    Trace,
    load_trace,
    prepare,
    project_queues,
    uniform_nodes,
)

HOUR = 3600.0
GPUS_PER_NODE = 8
CHECKPOINT_SECONDS = 1800.0
RESTART_SECONDS = 60.0


def shared_traces() -> Path | None:
    """$CORRAL_TRACES, else ../shared/traces beside the repository, when it has Helios."""
    configured = os.environ.get("CORRAL_TRACES")
    folder = Path(configured) if configured else REPO.parent / "shared" / "traces"
    return folder if (folder / "helios-sc21").is_dir() else None


def replay(
    trace: Trace, gpus: int, min_runtime: float | None, interval: float, aware: bool
) -> tuple[SimResult, float]:
    """One replay on `gpus` GPUs with `min_runtime` as every queue's reclaim min-runtime
    (None: off), checkpoint-aware victims or not, and the CPU seconds it took."""
    queues = tuple(
        dataclasses.replace(queue, reclaim_min_runtime=min_runtime)
        for queue in project_queues(dict(trace.quotas))
    )
    config = SchedulerConfig(actions=("allocate", "consolidate", "reclaim"))
    cluster = Cluster(f"{gpus} GPUs", uniform_nodes(gpus, GPUS_PER_NODE), queues, config)
    settings = SimSettings(
        cycle_interval=interval,
        checkpoint_interval=CHECKPOINT_SECONDS,
        restart_cost=RESTART_SECONDS,
        # Both runs tell the engine how long each job has run, as a live server does, so
        # that they differ in the protection alone (not in the victim order it implies).
        running_for=True,
        checkpoint_aware=aware,
    )
    began = time.process_time()
    result = Simulation(prepare("corral", cluster), trace, cluster.quotas(), settings).run()
    return result, time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=None, help="default: the VCs' quotas")
    parser.add_argument("--days", type=float, default=None, help="only the first DAYS of jobs")
    parser.add_argument("--min-runtime", type=float, default=600.0, help="seconds")
    parser.add_argument("--interval", type=float, default=60.0, help="cycle interval, s")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    root = shared_traces()
    if root is None:
        print("skipped: the shared traces (helios-sc21) are not here; set CORRAL_TRACES")
        return
    trace = load_trace("helios", root=root)
    if args.days is not None:
        first = trace.jobs[0].submitted if trace.jobs else 0.0
        trace = trace.head(
            sum(1 for job in trace.jobs if job.submitted - first < args.days * 86400)
        )
    gpus = args.gpus or int(sum(trace.quotas.values()))
    variants = {
        "off": (None, False),
        "on": (args.min_runtime, False),
        "off_aware": (None, True),
        "on_aware": (args.min_runtime, True),
    }
    results = {
        name: replay(trace, gpus, min_runtime, args.interval, aware)
        for name, (min_runtime, aware) in variants.items()
    }
    span = f"first {args.days:g} days" if args.days is not None else "all of May 2020"
    print(
        f"Helios, {len(trace.jobs):,} jobs ({span}) of {len(trace.quotas)} VCs on {gpus} GPUs; "
        f"cycles every {args.interval:g} s; checkpoints every 30 min, restart 60 s\n"
    )
    rows = []
    for name, (result, cpu) in results.items():
        min_runtime, aware = variants[name]
        label = "off" if min_runtime is None else f"{min_runtime / 60:g} min"
        by_action = result.evictions_by_action
        rows.append(
            [
                label,
                "checkpoint-aware" if aware else "ran least",
                f"{result.preemptions:,}",
                f"{by_action.get('reclaim', 0):,}",
                f"{by_action.get('consolidate', 0):,}",
                f"{result.lost_gpu_hours:,.1f}",
                f"{(result.queueing_delay.p95 or 0.0) / HOUR:.2f}",
                f"{(result.queueing_delay.mean or 0.0) / HOUR:.2f}",
                f"{100 * result.allocation:.1f}%",
                f"{cpu:.0f}",
            ]
        )
    headers = ["reclaim min-runtime", "victims", "evictions", "reclaims", "moves", "lost GPU-h"]
    print(table([*headers, "p95 wait h", "mean wait h", "busy", "CPU s"], rows))
    off, on = results["off"][0], results["on"][0]
    if args.json:
        summary = {
            "gpus": gpus,
            "jobs": len(trace.jobs),
            "min_runtime_s": args.min_runtime,
            "evictions_off": off.preemptions,
            "evictions_on": on.preemptions,
            "lost_gpu_hours_off": round(off.lost_gpu_hours, 1),
            "lost_gpu_hours_on": round(on.lost_gpu_hours, 1),
            "p95_wait_h_off": round((off.queueing_delay.p95 or 0) / HOUR, 3),
            "p95_wait_h_on": round((on.queueing_delay.p95 or 0) / HOUR, 3),
            "evictions_off_checkpoint_aware": results["off_aware"][0].preemptions,
            "evictions_on_checkpoint_aware": results["on_aware"][0].preemptions,
            "lost_gpu_hours_off_checkpoint_aware": round(results["off_aware"][0].lost_gpu_hours, 1),
            "lost_gpu_hours_on_checkpoint_aware": round(results["on_aware"][0].lost_gpu_hours, 1),
            "cpu_s": round(sum(cpu for _, cpu in results.values()), 1),
        }
        print(json.dumps(summary))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
