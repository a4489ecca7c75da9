"""Pooling: how many GPUs static partitions, one shared pool and corral need for the same
work, on the Philly job table (and on Helios' per-VC demand series).

    python benchmarks/pooling.py [--sizes 1,2,3,4,5,6] [--interval 60] [--json]
    python benchmarks/pooling.py --dataset helios [--json]

Philly (`pollux-osdi21/traces/philly.csv`, 82,247 jobs over 109 days): each of the 15
virtual clusters is a project whose deserved quota is its share of the cluster's GPUs in
proportion to its mean demand (its GPU-seconds over the trace's span), in whole GPUs.
For clusters of 1x to 6x the mean total demand (374 GPUs), in nodes of 8 GPUs, it runs
`static` (each project limited to its quota), `fifo` (one pool, no quotas) and `corral`
(quotas, borrowing, reclaim), and reports the busy share of GPUs over the trace window,
queueing delay overall and per project, preemptions and GPU-hours lost to them. Then,
per policy, the fewest GPUs at which the p95 queueing delay is at most 2 hours (the
sizes in ascending order up to the first that passes, then bisection below it in steps
of --resolution GPUs: `corral.sim.search.fewest_passing`; sizes above the first passing
one show "not run" unless --full-grid), and, at corral's size, how much longer any
project's p95 delay is under corral than under static.

Cycles run every 60 s (as in Pollux's simulator; the 2-hour threshold does not notice
the difference) and corral's cycle allocates, consolidates and reclaims: every Philly
job has the same priority, so priority preemption has nothing to do. A run stops as soon
as its p95 is certainly above 2 hours: more than 5% of jobs have waited longer
(`corral.sim.search.LateCount`; --budget gives a run that many CPU seconds first, for
its delays in the table). A cluster far too small for the load builds a backlog of
thousands of jobs, and every cycle costs the engine time in proportion to it.

Goal: corral reaches the 2-hour p95 with at most 1.1x the GPUs of the shared pool, and
there no project's p95 is more than 15 minutes above its p95 under static. A rough
first-fit estimate: static about 2,250 GPUs (17% busy), one pool about 750 (50% busy).

Helios (`helios-sc21`, five VCs of the Earth cluster, May 2020): each VC's quota is its
GPUs; the demand series (running + pending GPUs per minute) become jobs. At the VCs'
488 GPUs it compares the three policies, then finds the fewest GPUs with which corral
keeps the p95 delay within static's at 488 GPUs, and the busy share there. Vendor
figures for comparison: utilisation from under 45% to over 80%, and from 28% to over 70%.

With --json the last line is one JSON object; for Philly:
{"gpus_for_p95_2h": {"static": ..., "fifo": ..., "corral": ...},
 "worst_project_p95_excess_hours": ...}
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench_support import table, traces_dir
from corral.model import SchedulerConfig
from corral.sim import (
    Cluster,
    SimResult,
    SimSettings,
    Simulation,
    Trace,
    apportion,
    load_trace,
    prepare,
    project_queues,
    uniform_nodes,
)
from corral.sim.search import LateCount, fewest_passing, late_limit

HOUR = 3600.0
THRESHOLD = 2 * HOUR
GPUS_PER_NODE = 8
POLICIES = ("static", "fifo", "corral")
FIRST_FIT = {"static": 2250, "fifo": 750}


class Undersized(Exception):
    """More than 5% of jobs have waited longer than the threshold: p95 is above it."""

    def __init__(self, now: float) -> None:
        super().__init__(now)
        self.now = now


@dataclass(frozen=True, slots=True)
class Stopped:
    """A run stopped once its p95 was certainly above 2 hours, at `day` of the trace."""

    day: float


def cluster_for(gpus: int, weights: Mapping[str, float], config: SchedulerConfig) -> Cluster:
    nodes = uniform_nodes(gpus, GPUS_PER_NODE)
    total = sum(node.gpus for node in nodes)
    return Cluster(f"{total} GPUs", nodes, project_queues(apportion(total, weights)), config)


def run(
    policy: str,
    gpus: int,
    trace: Trace,
    weights: Mapping[str, float],
    settings: SimSettings,
    config: SchedulerConfig,
    budget: float = math.inf,
    threshold: float = THRESHOLD,
) -> SimResult | Stopped:
    """One replay. Once it has used `budget` CPU seconds (0: at once), it stops as soon
    as more than 5% of jobs have waited longer than `threshold`, which settles its p95
    above that."""
    cluster = cluster_for(gpus, weights, config)
    simulation = Simulation(prepare(policy, cluster), trace, cluster.quotas(), settings)
    limit = late_limit(len(trace.jobs))
    late = LateCount(simulation.jobs, threshold)
    began = time.process_time()

    def check(now: float) -> None:
        # The count is kept up from the start so a run past its budget stops at the first
        # report at which it is certain (the same report a full scan would stop at).
        if late.advance(now) > limit and time.process_time() - began >= budget:
            raise Undersized(now)

    try:
        result = simulation.run(check if math.isfinite(budget) else None)
    except Undersized as stop:
        print(
            f"  {policy} {gpus} GPUs: p95 > {threshold / HOUR:.2f} h, "
            f"stopped at day {stop.now / 86400:.0f}, {time.process_time() - began:.0f} CPU s",
            file=sys.stderr,
            flush=True,
        )
        return Stopped(stop.now / 86400)
    print(
        f"  {policy} {gpus} GPUs: p95 {(result.queueing_delay.p95 or 0) / HOUR:.2f} h, "
        f"{time.process_time() - began:.0f} CPU s",
        file=sys.stderr,
        flush=True,
    )
    return result


def hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / HOUR:.2f}"


def percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def fewest_gpus(
    policy: str,
    sizes: Sequence[int],
    trace: Trace,
    weights: Mapping[str, float],
    settings: SimSettings,
    config: SchedulerConfig,
    resolution: int,
    target: float = THRESHOLD,
    budget: float = 0.0,
    known: Mapping[int, SimResult | Stopped] | None = None,
) -> tuple[int | None, SimResult | None, dict[int, SimResult | Stopped]]:
    """The fewest GPUs (a multiple of `resolution`) with p95 at most `target`: `sizes` in
    ascending order up to the first that passes, then bisection between it and the size
    below (`corral.sim.search.fewest_passing`); and every run made, by size. Runs in
    `known` are reused."""

    def probe(size: int) -> tuple[bool, SimResult | Stopped]:
        result = run(policy, size, trace, weights, settings, config, budget, target)
        return good(result, target), result

    fewest, best, probes = fewest_passing(
        sizes,
        probe,
        resolution,
        {size: (good(result, target), result) for size, result in (known or {}).items()},
    )
    assert best is None or isinstance(best, SimResult)
    return fewest, best, {size: result for size, (_, result) in probes.items()}


def good(result: SimResult | Stopped, target: float) -> bool:
    """Whether a run's p95 queueing delay is at most `target`."""
    return isinstance(result, SimResult) and (result.queueing_delay.p95 or 0) <= target


def grid_tables(
    grid: Mapping[str, Mapping[int, SimResult | Stopped]], sizes: Sequence[int]
) -> None:
    rows = []
    for size in sizes:
        for policy in POLICIES:
            result = grid[policy].get(size)
            if result is None:
                rows.append([str(size), policy, "-", "-", "not run", "-", "-", "-", "-"])
                continue
            if isinstance(result, Stopped):
                stopped = f"> 2 (stopped, day {result.day:.0f})"
                rows.append([str(size), policy, "-", "-", stopped, "-", "-", "-", "-"])
                continue
            rows.append(
                [
                    str(size),
                    policy,
                    percent(result.allocation),
                    hours(result.queueing_delay.mean),
                    hours(result.queueing_delay.p95),
                    f"{result.unstarted}",
                    f"{result.preemptions:,}",
                    f"{result.lost_gpu_hours:,.0f}",
                    f"{result.wall_seconds:.0f}",
                ]
            )
    header = [
        "GPUs",
        "policy",
        "busy",
        "mean delay h",
        "p95 delay h",
        "never started",
        "preemptions",
        "lost GPU-h",
        "seconds",
    ]
    print(table(header, rows))
    complete = [r for column in grid.values() for r in column.values() if isinstance(r, SimResult)]
    for size in sizes:
        print(f"\nqueueing delay per project at {size} GPUs, hours (mean / p95)\n")
        rows = [
            [project, *(per_project(grid[p].get(size), project) for p in POLICIES)]
            for project in complete[0].projects
        ]
        print(table(["project", *POLICIES], rows))


def per_project(result: SimResult | Stopped | None, project: str) -> str:
    if result is None:
        return "not run"
    if isinstance(result, Stopped):
        return "stopped"
    delay = result.by_project[project].queueing_delay
    return f"{hours(delay.mean)} / {hours(delay.p95)}"


def philly(args: argparse.Namespace) -> dict[str, object]:
    trace = load_trace("philly", root=traces_dir())
    weights = trace.mean_demand()
    demand = sum(weights.values())
    settings = SimSettings(cycle_interval=args.interval)
    config = SchedulerConfig(actions=tuple(args.actions.split(",")))
    sizes = [
        math.ceil(float(k) * demand / GPUS_PER_NODE) * GPUS_PER_NODE for k in args.sizes.split(",")
    ]
    print(
        f"Philly: {len(trace.jobs):,} jobs, mean demand {demand:.1f} GPUs; sizes {sizes}; "
        f"cycles every {args.interval:g} s; corral's actions {', '.join(config.actions)}\n"
    )
    # Per policy, the sizes in ascending order up to the first at which the p95 is within
    # 2 h, then bisection below it; larger sizes cannot change the answer and run only
    # with --full-grid (for the table).
    grid: dict[str, dict[int, SimResult | Stopped]] = {policy: {} for policy in POLICIES}
    fewest: dict[str, int | None] = {}
    at_fewest: dict[str, SimResult | None] = {}
    probes: dict[str, dict[int, SimResult | Stopped]] = {}
    for policy in POLICIES:
        if args.full_grid:
            for size in sizes:
                grid[policy][size] = run(
                    policy, size, trace, weights, settings, config, budget=args.budget
                )
        fewest[policy], at_fewest[policy], probes[policy] = fewest_gpus(
            policy,
            sizes,
            trace,
            weights,
            settings,
            config,
            args.resolution,
            budget=args.budget,
            known=grid[policy],
        )
        grid[policy].update(
            (size, probes[policy][size]) for size in sizes if size in probes[policy]
        )
    grid_tables(grid, sizes)

    print("\nfewest GPUs with p95 queueing delay <= 2 h\n")
    rows = []
    for policy in POLICIES:
        found = at_fewest[policy]
        rows.append(
            [
                policy,
                str(fewest[policy] or "> largest size"),
                percent(found.allocation) if found else "-",
                hours(found.queueing_delay.p95) if found else "-",
                str(FIRST_FIT.get(policy, "-")),
            ]
        )
    print(table(["policy", "GPUs", "busy", "p95 delay h", "first-fit estimate"], rows))

    worst = None
    corral_gpus, corral_result = fewest["corral"], at_fewest["corral"]
    if corral_gpus is not None and corral_result is not None:
        # A run the static search made at this size is reused only if it ran to the end.
        known = probes["static"].get(corral_gpus)
        static = (
            known
            if isinstance(known, SimResult)
            else run("static", corral_gpus, trace, weights, settings, config)
        )
        assert isinstance(static, SimResult)
        print(f"\nper-project p95 queueing delay at {corral_gpus} GPUs, hours\n")
        rows = []
        excesses = []
        for project in corral_result.projects:
            ours = corral_result.by_project[project].queueing_delay.p95 or 0.0
            theirs = static.by_project[project].queueing_delay.p95 or 0.0
            excesses.append(ours - theirs)
            rows.append([project, hours(theirs), hours(ours), hours(ours - theirs)])
        print(table(["project", "static", "corral", "corral - static"], rows))
        worst = round(max(excesses) / HOUR, 3)
        fifo_gpus = fewest["fifo"]
        if fifo_gpus:
            print(
                f"\ncorral needs {corral_gpus / fifo_gpus:.2f}x the GPUs of the shared pool "
                f"(goal <= 1.1x); worst project p95 excess over static {worst:.2f} h "
                "(goal <= 0.25 h)"
            )
    return {"gpus_for_p95_2h": fewest, "worst_project_p95_excess_hours": worst}


def helios(args: argparse.Namespace) -> dict[str, object]:
    trace = load_trace("helios", root=traces_dir())
    quotas = dict(trace.quotas)
    full = int(sum(quotas.values()))
    settings = SimSettings(cycle_interval=args.interval)
    config = SchedulerConfig(actions=tuple(args.actions.split(",")))
    print(
        f"Helios: {len(trace.jobs):,} jobs from the demand of {len(quotas)} VCs, "
        f"{full} GPUs of quota\n"
    )
    results: dict[str, SimResult] = {}
    for policy in POLICIES:
        result = run(policy, full, trace, quotas, settings, config)
        assert isinstance(result, SimResult)
        results[policy] = result
    rows = [
        [
            policy,
            percent(result.allocation),
            hours(result.queueing_delay.mean),
            hours(result.queueing_delay.p95),
            f"{result.mean_pending_gpus:.1f}",
            f"{result.preemptions:,}",
            f"{result.lost_gpu_hours:,.0f}",
        ]
        for policy, result in results.items()
    ]
    print(
        table(
            [
                "policy",
                "busy",
                "mean delay h",
                "p95 delay h",
                "pending GPUs",
                "preemptions",
                "lost GPU-h",
            ],
            rows,
        )
    )
    static, corral = results["static"], results["corral"]
    print(f"\nper VC at {full} GPUs: mean GPUs held and pending, static / corral\n")
    rows = [
        [
            vc,
            f"{quotas[vc]:.0f}",
            f"{static.by_project[vc].mean_gpus:.1f} / {corral.by_project[vc].mean_gpus:.1f}",
            f"{static.by_project[vc].mean_pending_gpus:.1f} / "
            f"{corral.by_project[vc].mean_pending_gpus:.1f}",
            f"{hours(static.by_project[vc].queueing_delay.p95)} / "
            f"{hours(corral.by_project[vc].queueing_delay.p95)}",
        ]
        for vc in static.projects
    ]
    print(table(["VC", "quota", "held", "pending", "p95 delay h"], rows))
    target = static.queueing_delay.p95 or 0.0
    step = GPUS_PER_NODE * 8
    sizes = list(range(full - 3 * step, full + 1, step))
    fewest, at_fewest, _ = fewest_gpus(
        "corral", sizes, trace, quotas, settings, config, args.resolution, target=target
    )
    if fewest and at_fewest:
        print(
            f"\ncorral keeps the p95 delay within static's ({hours(target)} h at {full} GPUs) "
            f"down to {fewest} GPUs, {percent(at_fewest.allocation)} busy, against static's "
            f"{percent(static.allocation)}. Vendor figures: under 45% to over 80%; 28% to "
            "over 70%."
        )
    return {
        "gpus": full,
        "busy": {policy: round(result.allocation, 4) for policy, result in results.items()},
        "p95_delay_hours": {
            policy: round((result.queueing_delay.p95 or 0) / HOUR, 3)
            for policy, result in results.items()
        },
        "corral_gpus_for_static_p95": fewest,
        "corral_busy_there": round(at_fewest.allocation, 4) if at_fewest else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=("philly", "helios"), default="philly")
    parser.add_argument("--sizes", default="1,2,3,4,5,6", help="multiples of mean demand")
    parser.add_argument("--interval", type=float, default=60.0, help="cycle interval, s")
    parser.add_argument("--resolution", type=int, default=16, help="GPU step of the search")
    parser.add_argument(
        "--actions", default="allocate,consolidate,reclaim", help="corral's cycle actions"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="CPU seconds after which a run whose p95 is certainly over 2 h stops",
    )
    parser.add_argument(
        "--full-grid",
        action="store_true",
        help="run every size of --sizes for the table, not only up to the first passing one",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    began, cpu = time.perf_counter(), time.process_time()
    summary = philly(args) if args.dataset == "philly" else helios(args)
    print(
        f"\nthe study took {time.perf_counter() - began:.0f} s, "
        f"{time.process_time() - cpu:.0f} CPU s",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
