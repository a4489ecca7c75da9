"""Node pools at scale: engine_scale.py's reclaim case, as one pool and as two.

    python benchmarks/pools_scale.py [--json] [--repeat N]

The reclaim case (500 nodes x 8 GPUs held by 20 borrowing queues, 4,000 pending jobs of
20 starved queues) is run once as it is, and once with the nodes split into pools a and
b of 250 nodes each, every queue's deserved quota split evenly between them, and the
pending jobs preferring a then b, or b then a, by turns. With pools each pool is a cycle
of its own, twice over (without evicting, then with every action), so the figure shows
what the division by pool costs (the evictions differ too: quotas split by pool divide
the GPUs otherwise than the whole-cluster ones). CPU seconds of this process, the best of
N runs. The last line with --json is one JSON object with
`reclaim_cycle_seconds_one_pool`, `reclaim_cycle_seconds_two_pools` and the evictions of
each.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from corral.model import PoolQuota, Snapshot, gpu_quota
from engine_scale import best_cycle, reclaim_snapshot


def pooled(snapshot: Snapshot) -> Snapshot:
    """The snapshot with its nodes in pools a and b and its quotas split between them."""
    half = len(snapshot.nodes) // 2
    nodes = tuple(
        replace(node, labels={"pool": "a" if index < half else "b"})
        for index, node in enumerate(snapshot.nodes)
    )
    queues = tuple(
        replace(
            queue,
            pools={pool: PoolQuota(gpu_quota(queue.deserved.gpu / 2)) for pool in ("a", "b")},
        )
        for queue in snapshot.queues
    )
    workloads = tuple(
        workload
        if workload.placements
        else replace(workload, node_pools=("a", "b") if index % 2 else ("b", "a"))
        for index, workload in enumerate(snapshot.workloads)
    )
    return Snapshot(nodes, queues, workloads)


def best_of(snapshot: Snapshot, repeat: int) -> tuple[float, int]:
    seconds, decisions = best_cycle(snapshot, repeat)
    return seconds, len(decisions.evictions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the best counts")
    args = parser.parse_args()
    snapshot = reclaim_snapshot()
    one, one_evictions = best_of(snapshot, args.repeat)
    two, two_evictions = best_of(pooled(snapshot), args.repeat)
    print(f"reclaim cycle, one pool:  {one:.3f} s CPU, {one_evictions} evictions")
    print(f"reclaim cycle, two pools: {two:.3f} s CPU, {two_evictions} evictions")
    if args.json:
        print(
            json.dumps(
                {
                    "reclaim_cycle_seconds_one_pool": round(one, 3),
                    "reclaim_cycle_seconds_two_pools": round(two, 3),
                    "evictions_one_pool": one_evictions,
                    "evictions_two_pools": two_evictions,
                }
            )
        )


if __name__ == "__main__":
    main()
