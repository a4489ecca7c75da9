"""A burst of submissions into a fresh PostgreSQL store, and the scheduler's reads of it.

    python benchmarks/store_burst.py [--count N] [--batch N] [--json]

Submits --count workloads (default 50,000) in batches of --batch (1,000) through
`Store.submit_many`, as the batch endpoint does, then reads them as the scheduler does:
the whole snapshot, and every workload by name (`Store.named_workloads`, what a cycle
reads again after task ends). Run twice on fresh databases: as the store is, and as a
baseline with its own refresh of the planner's statistics turned off
(`Database.grew`), which leaves them to autovacuum, about once a minute. Prints seconds
per step and the baseline's over the store's. With --json the last line is one JSON
object: {"seconds": {"store": {...}, "baseline": {...}}, "speedup": {...}}.
"""

from __future__ import annotations

import argparse
import json
import time

from bench_support import postgres_url, table
from corral.model import Queue, Resources, TaskGroup
from corral.model.spec import WorkloadSpec
from corral.store import Store, database

STEPS = ("submit", "snapshot", "by_name")


def spec(name: str) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        project="team",
        user="alice",
        task_groups=(TaskGroup("main", 1, 1.0),),
        command=("true",),
    )


def burst(count: int, batch: int) -> dict[str, float]:
    seconds: dict[str, float] = {}
    with postgres_url() as url:
        store = Store("postgresql+psycopg://" + url.split("://", 1)[1])
        try:
            store.create_queue(Queue("team", deserved=Resources(gpu=8)))
            names = [f"w{i}" for i in range(count)]
            start = time.perf_counter()
            for first in range(0, count, batch):
                outcomes = store.submit_many([spec(n) for n in names[first : first + batch]])
                failed = [o for o in outcomes if isinstance(o, Exception)]
                if failed:
                    raise SystemExit(f"a submission failed: {failed[0]}")
            seconds["submit"] = time.perf_counter() - start
            start = time.perf_counter()
            snapshot, newest = store.read_snapshot()
            seconds["snapshot"] = time.perf_counter() - start
            start = time.perf_counter()
            named = store.named_workloads(names, newest)
            seconds["by_name"] = time.perf_counter() - start
            if len(named) != count or len(snapshot.workloads) != count:
                raise SystemExit("the reads did not find every workload")
        finally:
            store.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    if args.count < 1 or args.batch < 1:
        parser.error("--count and --batch: at least 1")
    store = burst(args.count, args.batch)
    rows_at_least = database.ANALYZE_ROWS
    database.ANALYZE_ROWS = 1 << 62  # the baseline: never
    try:
        baseline = burst(args.count, args.batch)
    finally:
        database.ANALYZE_ROWS = rows_at_least
    speedup = {step: baseline[step] / store[step] for step in STEPS}
    print(f"{args.count:,} workloads in batches of {args.batch:,} on PostgreSQL\n")
    rows = [
        [step, f"{store[step]:.2f}", f"{baseline[step]:.2f}", f"{speedup[step]:.1f}x"]
        for step in STEPS
    ]
    print(table(["step", "store s", "baseline s", "baseline / store"], rows))
    if args.json:
        print(
            json.dumps(
                {
                    "seconds": {
                        "store": {k: round(v, 2) for k, v in store.items()},
                        "baseline": {k: round(v, 2) for k, v in baseline.items()},
                    },
                    "speedup": {k: round(v, 1) for k, v in speedup.items()},
                }
            )
        )


if __name__ == "__main__":
    main()
