"""The flood study: one team floods an idle cluster for a day, then every team submits;
each team's share of the next day's GPU-hours against its weight, with and without
time-decayed fair share.

    python benchmarks/flood.py [--half-life 24h] [--k 1] [--seed 1] [--json]

The cluster: 64 GPUs (8 nodes of 8). Four teams, each deserving 4 GPUs (16 of 64 are
guaranteed, 48 are surplus divided by over-quota weight): `flood` (weight 2), `a`
(weight 1), `b` (weight 1) and `c` (weight 2). The cycle allocates, consolidates and
reclaims, every 60 s of virtual time.

Day 1: only `flood` submits, enough work to keep the whole cluster busy (jobs of 1, 2, 4
or 8 GPUs running 1 to 4 hours, submitted at random times). Day 2: every team, `flood`
included, submits as much again: demand is four times the cluster. The simulator replays
the two days twice, without and with time-decayed fair share (the half-life and k given,
on every team), and measures each team's GPU-hours over day 2 as a share of all of day 2's.

The synthetic trace is seeded: every run gives the same figures. With --json the last
line is one JSON object: `share_vs_weight_off` and `share_vs_weight_on`, each mapping a
team to its day-2 `share` of GPU-hours and its `weight` (normalised), and the settings.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace

from bench_support import table
from corral.model import Queue, SchedulerConfig, TaskGroup, gpu_quota
from corral.model.durations import format_duration, parse_duration
from corral.sim import Cluster, SimSettings, Simulation, prepare, uniform_nodes
from corral.sim.trace import Job, Trace

HOUR = 3600.0
DAY = 24 * HOUR
GPUS = 64
DESERVED = 4
WEIGHTS = {"flood": 2.0, "a": 1.0, "b": 1.0, "c": 2.0}
JOB_GPUS = (1, 2, 4, 8)


def team_jobs(rng: random.Random, team: str, start: float, gpu_hours: float, tag: str) -> list[Job]:
    """Jobs of `team` submitted over the day from `start`, `gpu_hours` of work in all;
    `tag` keeps their names apart from the team's other jobs."""
    jobs: list[Job] = []
    total = 0.0
    while total < gpu_hours:
        gpus = rng.choice(JOB_GPUS)
        duration = rng.uniform(1.0, 4.0) * HOUR
        submitted = start + rng.uniform(0.0, DAY - 4 * HOUR)
        name = f"{team}-{tag}{len(jobs):04d}"
        jobs.append(Job(name, team, submitted, duration, (TaskGroup(gpu=float(gpus)),)))
        total += gpus * duration / HOUR
    return jobs


def flood_trace(seed: int) -> Trace:
    """Day 1: `flood` alone, a day's work for the whole cluster, half of it at once (it
    floods the idle cluster) and half over the day. Day 2: every team as much again."""
    rng = random.Random(seed)
    day_of_cluster = GPUS * 24.0
    burst = team_jobs(rng, "flood", 0.0, day_of_cluster / 2, "0-")
    jobs = [replace(job, submitted=0.0) for job in burst]
    jobs += team_jobs(rng, "flood", 0.0, day_of_cluster / 2, "1-")
    for team in WEIGHTS:
        jobs += team_jobs(rng, team, DAY, day_of_cluster, "2-")
    jobs.sort(key=lambda job: (job.submitted, job.name))
    return Trace("flood", f"flood study (seed {seed})", tuple(jobs), 2 * DAY)


def queues(half_life: float | None, k: float) -> tuple[Queue, ...]:
    return tuple(
        Queue(
            team,
            deserved=gpu_quota(DESERVED),
            over_quota_weight=replace(Queue(team).over_quota_weight, gpu=weight),
            fair_share_half_life=half_life,
            fair_share_k=k if half_life is not None else None,
        )
        for team, weight in WEIGHTS.items()
    )


def day_two_gpu_hours(trace: Trace, half_life: float | None, k: float) -> dict[str, float]:
    """Each team's GPU-hours over day 2: the run to 48 h less the run to 24 h (the same
    replay stopped earlier)."""
    config = SchedulerConfig(actions=("allocate", "consolidate", "reclaim"))
    cluster = Cluster("flood", uniform_nodes(GPUS), queues(half_life, k), config)
    held: list[dict[str, float]] = []
    for horizon in (DAY, 2 * DAY):
        settings = SimSettings(cycle_interval=60.0, horizon=horizon)
        setup = prepare("corral", cluster)
        result = Simulation(setup, trace, cluster.quotas(), settings).run()
        held.append({team: r.gpu_hours for team, r in result.by_project.items()})
    return {team: held[1].get(team, 0.0) - held[0].get(team, 0.0) for team in WEIGHTS}


def shares(gpu_hours: dict[str, float]) -> dict[str, dict[str, float]]:
    total = sum(gpu_hours.values()) or 1.0
    weight_total = sum(WEIGHTS.values())
    return {
        team: {
            "share": round(gpu_hours[team] / total, 4),
            "weight": round(WEIGHTS[team] / weight_total, 4),
            "gpu_hours": round(gpu_hours[team], 1),
        }
        for team in WEIGHTS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half-life", default="24h", help="time-decayed fair share half-life")
    parser.add_argument("--k", type=float, default=1.0, help="usage factor k")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    half_life = parse_duration(args.half_life)

    started = time.process_time()
    trace = flood_trace(args.seed)
    off = shares(day_two_gpu_hours(trace, None, args.k))
    on = shares(day_two_gpu_hours(trace, half_life, args.k))
    cpu = time.process_time() - started

    print(
        f"Flood study: {GPUS} GPUs, {len(trace.jobs)} jobs; `flood` alone on day 1, every "
        f"team on day 2. Share of day 2's GPU-hours against the team's weight; time-decayed "
        f"fair share with a {format_duration(half_life)} half-life and k = {args.k:g}."
    )
    rows = [
        [
            team,
            f"{on[team]['weight']:.1%}",
            f"{off[team]['share']:.1%}",
            f"{on[team]['share']:.1%}",
            f"{off[team]['gpu_hours']:.0f}",
            f"{on[team]['gpu_hours']:.0f}",
        ]
        for team in WEIGHTS
    ]
    header = ["team", "weight", "share off", "share on", "GPU-h off", "GPU-h on"]
    print(table(header, rows))
    print(f"CPU time: {cpu:.1f} s")
    if args.json:
        print(
            json.dumps(
                {
                    "share_vs_weight_off": off,
                    "share_vs_weight_on": on,
                    "half_life_h": half_life / HOUR,
                    "k": args.k,
                    "gpus": GPUS,
                    "cpu_seconds": round(cpu, 1),
                }
            )
        )


if __name__ == "__main__":
    main()
