"""Engine scale: one reclaim-heavy cycle and one placement-heavy cycle.

    python benchmarks/engine_scale.py [--json] [--repeat N] [--policy NAME ... | --all-policies]

1. Reclaim at scale: 500 nodes x 8 GPUs, all 4,000 GPUs held by single-GPU training jobs
   of queues above their fair share, and 4,000 pending single-GPU jobs of starved queues.
   One full cycle (allocate, consolidate, reclaim, preempt). Baseline: the Run:ai
   scheduler (Go) needed 59 s for this shape; target at most 0.25 s.
2. Placement throughput: 5,000 empty nodes x 8 GPUs and 32,500 pending workloads in 50
   queues: 24,000 single-GPU jobs, 8,000 fractional jobs (0.25 to 0.75 of a GPU) and 500
   gangs of 2 to 4 tasks x 8 GPUs. One cycle; placed tasks per second. Baselines:
   kube-scheduler's performance tests expect 180 pods/s with GPU-like resources and about
   800 pods/s without; target at least 30,000 placements/s.
3. Reclaim over 100,000 GPUs: the first case 25 times over (12,500 nodes x 8 GPUs) with
   jobs of 2 GPUs, 50,000 running and 50,000 pending; 31,240 are evicted. Target under 5 s.

With --policy time-decay (or --time-decay) every queue has time-decayed fair share on (a
24h half-life) and the snapshots carry a usage share for every queue, so each cycle also
works out the decayed weights. The shares are even, as the weights are, so the decisions
stay the same (the evictions printed show it) and only the cost is measured.

With --all-policies (or --policy NAME, repeatable) the per-queue policies of issue 14 are
on: time-decay as above; min-runtime, 10 minutes (every running job has run an hour, so
none is protected, but each victim is checked); checkpoints, checkpoint-aware victims
(running jobs carry times since their last checkpoint, spread over half an hour, so victims
are ordered by lost work); reservations (reserve_after 30m, every pending job has waited an
hour and every running job has a max runtime, so each queue's head gets a reservation
worked out, which changes the decisions: work is kept off reserved nodes). Node pools are
measured on their own (`pools_scale.py`): they change the cluster's shape.

Times are CPU seconds of this process (the machine may be shared: they are the steadier
figure). The last line with --json is one JSON object with `reclaim_cycle_seconds`,
`placements_per_second` and `reclaim_cycle_100k_gpus_seconds`.

With --against REF (a tag, branch or commit of this repository) every case runs, in this
same run, on this tree's engine and on REF's (checked out into a temporary worktree), each
in a process of its own, interleaved so that both see the same load: REF, this tree, REF,
this tree, ... `--repeat` times, the best of each counting. It prints the ratios (how many
times faster this tree is) beside the raw figures and the machine's load average, and
checks that both made the same decisions (a hash of every binding and eviction); the JSON
line then carries `against`, the reference's figures, `speedup` per case and
`decisions_equal`. REF's engine must take the snapshots built here (its `corral.model`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from corral.engine import schedule
from corral.model import (
    Decisions,
    Node,
    Placement,
    Queue,
    SchedulerConfig,
    Snapshot,
    TaskGroup,
    Workload,
    gpu_quota,
)

RUNAI_RECLAIM_SECONDS = 59.0
KUBE_GPU_PODS_PER_SECOND = 180.0
KUBE_PODS_PER_SECOND = 800.0


def reclaim_snapshot(scale: int = 1, job_gpus: int = 1) -> Snapshot:
    """20 borrowing queues (deserved 50, 200 running jobs each) and 20 starved queues
    (deserved 100, 200 pending jobs each). Fair share: 75 and 125, so 2,500 GPUs must be
    reclaimed in one cycle.

    `scale` multiplies the nodes and the deserved quotas, and the jobs by `scale /
    job_gpus`, each job asking for `job_gpus` GPUs: the running jobs still fill every GPU
    and the same share of them is reclaimed."""
    per_queue = 200 * scale // job_gpus
    nodes = tuple(Node(f"node{i}", gpus=8) for i in range(500 * scale))
    queues = [Queue(f"borrower{q}", deserved=gpu_quota(50 * scale)) for q in range(20)]
    queues += [Queue(f"owner{q}", deserved=gpu_quota(100 * scale)) for q in range(20)]
    groups = (TaskGroup(gpu=job_gpus),)
    workloads = []
    slot = 0
    for q in range(20):
        for j in range(per_queue):
            node, device = divmod(slot, 8)
            slot += job_gpus
            devices = tuple(range(device, device + job_gpus))
            workloads.append(
                Workload(
                    f"b{q}-{j}",
                    f"borrower{q}",
                    groups,
                    submitted=float(len(workloads)),
                    placements=(Placement(0, f"node{node}", devices, float(job_gpus)),),
                )
            )
    for q in range(20):
        for j in range(per_queue):
            workloads.append(
                Workload(f"o{q}-{j}", f"owner{q}", groups, submitted=float(len(workloads)))
            )
    return Snapshot(nodes, tuple(queues), tuple(workloads))


def placement_snapshot(seed: int = 7) -> Snapshot:
    rng = random.Random(seed)
    nodes = tuple(Node(f"node{i}", gpus=8) for i in range(5000))
    queues = tuple(Queue(f"q{q}", deserved=gpu_quota(800)) for q in range(50))
    kinds = ["single"] * 24_000 + ["fraction"] * 8_000 + ["gang"] * 500
    rng.shuffle(kinds)
    workloads = []
    for index, kind in enumerate(kinds):
        queue = f"q{index % 50}"
        if kind == "single":
            groups = (TaskGroup(gpu=1),)
        elif kind == "fraction":
            groups = (TaskGroup(gpu=rng.choice((0.25, 0.5, 0.75))),)
        else:
            groups = (TaskGroup(replicas=rng.randint(2, 4), gpu=8),)
        workloads.append(Workload(f"w{index}", queue, groups, submitted=float(index)))
    return Snapshot(nodes, queues, tuple(workloads))


def with_time_decay(snapshot: Snapshot) -> Snapshot:
    """The snapshot with time-decayed fair share on for every queue, and even usage shares
    (as even as the weights: the weights work out unchanged)."""
    queues = tuple(replace(queue, fair_share_half_life=86400.0) for queue in snapshot.queues)
    usage = {queue.name: 1.0 / len(queues) for queue in queues}
    return replace(snapshot, queues=queues, usage=usage)


POLICIES = ("time-decay", "min-runtime", "checkpoints", "reservations")


def with_policies(snapshot: Snapshot, names: Collection[str]) -> Snapshot:
    """The snapshot with the named policies of issue 14 on (see the module docstring)."""
    if "time-decay" in names:
        snapshot = with_time_decay(snapshot)
    queue_fields: dict[str, float] = {}
    if "min-runtime" in names:
        queue_fields.update(preempt_min_runtime=600.0, reclaim_min_runtime=600.0)
    if "reservations" in names:
        queue_fields["reserve_after"] = 1800.0
    queues = tuple(replace(queue, **queue_fields) for queue in snapshot.queues)
    workloads = []
    for index, workload in enumerate(snapshot.workloads):
        fields: dict[str, float] = {}
        if workload.placements:
            if "min-runtime" in names:
                fields["running_for"] = 3600.0
            if "checkpoints" in names:
                fields["since_checkpoint"] = float(index * 37 % 1800)
            if "reservations" in names:
                fields.update(running_for=3600.0, max_runtime=7200.0 + index % 3600)
        elif "reservations" in names:
            fields.update(waiting_for=3600.0, max_runtime=7200.0)
        workloads.append(replace(workload, **fields) if fields else workload)
    return replace(snapshot, queues=queues, workloads=tuple(workloads))


def best_cycle(snapshot: Snapshot, repeat: int) -> tuple[float, Decisions]:
    """The least CPU time of `repeat` cycles over `snapshot`, and the cycle's decisions."""
    best = float("inf")
    decisions = None
    for _ in range(max(repeat, 1)):
        start = time.process_time()
        decisions = schedule(snapshot, SchedulerConfig())
        best = min(best, time.process_time() - start)
    assert decisions is not None
    return best, decisions


def run_reclaim(
    repeat: int, scale: int = 1, job_gpus: int = 1, names: Collection[str] = ()
) -> tuple[float, int]:
    seconds, decisions = best_cycle(with_policies(reclaim_snapshot(scale, job_gpus), names), repeat)
    return seconds, len(decisions.evictions)


def run_placement(repeat: int, names: Collection[str] = ()) -> tuple[float, int, int]:
    snapshot = with_policies(placement_snapshot(), names)
    seconds, decisions = best_cycle(snapshot, repeat)
    placed = sum(len(placements) for placements in decisions.bindings.values())
    return seconds, placed, len(snapshot.workloads)


def decisions_hash(decisions: Decisions) -> str:
    """A digest of every binding (workload, task, node, devices, share) and eviction."""
    digest = hashlib.sha256()
    for workload in sorted(decisions.bindings):
        for placement in decisions.bindings[workload]:
            digest.update(repr((workload, placement.task, placement.node)).encode())
            digest.update(repr((tuple(placement.devices), placement.gpu)).encode())
    for eviction in sorted(decisions.evictions, key=lambda e: e.workload):
        digest.update(repr(("evict", eviction.workload, tuple(eviction.tasks))).encode())
    return digest.hexdigest()[:16]


# The cases --against compares: name -> (snapshot maker, what the figure is).
CASES = ("reclaim", "placement", "reclaim_100k")


def case_snapshot(case: str, names: Collection[str]) -> Snapshot:
    if case == "reclaim":
        return with_policies(reclaim_snapshot(), names)
    if case == "placement":
        return with_policies(placement_snapshot(), names)
    return with_policies(reclaim_snapshot(25, 2), names)


def run_case(case: str, names: Collection[str]) -> dict[str, float | str]:
    """One cycle of `case` with the engine this process imports: its CPU seconds, the
    tasks it placed and the hash of its decisions."""
    snapshot = case_snapshot(case, names)
    seconds, decisions = best_cycle(snapshot, 1)
    placed = sum(len(placements) for placements in decisions.bindings.values())
    return {"seconds": seconds, "placed": placed, "hash": decisions_hash(decisions)}


@contextmanager
def checked_out(ref: str) -> Iterator[Path]:
    """REF of this repository in a temporary worktree, removed afterwards."""
    repo = Path(__file__).resolve().parents[1]
    where = Path(tempfile.mkdtemp(prefix="corral-against-")) / "tree"
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(where), ref],
        check=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", str(where)], check=False
        )


def in_process_of_its_own(
    source: Path, case: str, names: Collection[str]
) -> dict[str, float | str]:
    """`run_case` in a fresh interpreter that imports corral from `source` (a src folder)."""
    command = [sys.executable, __file__, "--case", case, *(f"--policy={n}" for n in sorted(names))]
    environment = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    result: dict[str, float | str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(ref: str, repeat: int, names: Collection[str]) -> dict[str, object]:
    """Every case on REF's engine and this tree's, interleaved; the best of each."""
    here = Path(__file__).resolve().parents[1] / "src"
    load_before = os.getloadavg()
    results: dict[str, dict[str, list[dict[str, float | str]]]] = {}
    with checked_out(ref) as tree:
        for case in CASES:
            runs: dict[str, list[dict[str, float | str]]] = {"ref": [], "here": []}
            for _ in range(max(repeat, 1)):
                runs["ref"].append(in_process_of_its_own(tree / "src", case, names))
                runs["here"].append(in_process_of_its_own(here, case, names))
            results[case] = runs
    load_after = os.getloadavg()
    summary: dict[str, object] = {"against": ref, "repeat": repeat}
    equal = True
    for case, runs in results.items():
        best = {side: min(float(r["seconds"]) for r in found) for side, found in runs.items()}
        hashes = {str(r["hash"]) for found in runs.values() for r in found}
        equal = equal and len(hashes) == 1
        summary[case] = {
            "ref_seconds": round(best["ref"], 3),
            "seconds": round(best["here"], 3),
            "speedup": round(best["ref"] / best["here"], 2),
            "placed": runs["here"][0]["placed"],
            "decisions": sorted(hashes),
        }
        print(
            f"{case}: {best['here']:.3f} s here, {best['ref']:.3f} s on {ref}: "
            f"{best['ref'] / best['here']:.2f}x (best of {repeat} each, interleaved; "
            f"decisions {'equal' if len(hashes) == 1 else 'DIFFER'})"
        )
    summary["decisions_equal"] = equal
    summary["load_average"] = [round(load_before[0], 2), round(load_after[0], 2)]
    print(f"load average (1 min) before and after: {load_before[0]:.2f}, {load_after[0]:.2f}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the best counts")
    parser.add_argument(
        "--time-decay", action="store_true", help="time-decayed fair share on for every queue"
    )
    parser.add_argument(
        "--policy",
        action="append",
        choices=POLICIES,
        default=[],
        help="turn one policy on (repeatable)",
    )
    parser.add_argument("--all-policies", action="store_true", help="every --policy on")
    parser.add_argument(
        "--against", metavar="REF", help="compare with REF's engine in this run (see above)"
    )
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = set(POLICIES if args.all_policies else args.policy)
    if args.time_decay:
        names.add("time-decay")
    if args.case:  # one case in a process of its own, for --against
        print(json.dumps(run_case(args.case, names)))
        return
    if args.against:
        summary = compare(args.against, args.repeat, names)
        if args.json:
            print(json.dumps(summary))
        return

    reclaim_seconds, evictions = run_reclaim(args.repeat, names=names)
    print(
        f"reclaim cycle: {reclaim_seconds:.2f} s for 500 nodes x 8 GPUs, {evictions} evictions "
        f"({RUNAI_RECLAIM_SECONDS / reclaim_seconds:.0f}x faster than the 59 s baseline; "
        "target <= 0.25 s)"
    )
    placement_seconds, placed, workloads = run_placement(args.repeat, names)
    rate = placed / placement_seconds
    print(
        f"placement: {placed} tasks of {workloads} workloads in {placement_seconds:.2f} s = "
        f"{rate:,.0f} placements/s ({rate / KUBE_GPU_PODS_PER_SECOND:.0f}x kube-scheduler's "
        f"180 GPU pods/s, {rate / KUBE_PODS_PER_SECOND:.1f}x its 800 pods/s; target >= 30,000)"
    )
    big_seconds, big_evictions = run_reclaim(args.repeat, scale=25, job_gpus=2, names=names)
    print(
        f"reclaim cycle, 100,000 GPUs: {big_seconds:.2f} s for 12,500 nodes x 8 GPUs, "
        f"{big_evictions} evictions (target < 5 s)"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "reclaim_cycle_seconds": round(reclaim_seconds, 3),
                    "placements_per_second": round(rate, 1),
                    "reclaim_cycle_100k_gpus_seconds": round(big_seconds, 2),
                }
            )
        )


if __name__ == "__main__":
    main()
