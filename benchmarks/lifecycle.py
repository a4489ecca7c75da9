"""What arrays, dependencies and estimated starts cost the scheduler.

    python benchmarks/lifecycle.py [--json] [--workloads W] [--nodes N]

On a store on SQLite in a temporary directory, with N nodes of 8 GPUs: W plain pending
workloads, then an array of W members with a running limit of 8, then W workloads that
wait for a dependency. Measured: `snapshot_s` (a full snapshot read) after each step,
`resolve_idle_s` (the per-cycle look for held work when there is none),
`resolve_held_s` (a look at W workloads held by a running one, none released, as a
cycle makes after a change), `resolve_held_skip_s` (a cycle's look when nothing changed
since the last), and
`estimate_s` (one estimated start on N nodes half full, with 100 running workloads of
known end). With --json the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import corral.store.lifecycle as lifecycle
from corral.engine.estimate import estimate_start
from corral.model import Decisions, Node, Placement, Queue, Snapshot, TaskGroup, Workload
from corral.model.arrays import ArrayMember, Dependency
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store


def timed(action: Callable[[], Any], repeat: int = 5) -> float:
    """The median seconds of `repeat` calls."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def spec(name: str, **fields: Any) -> WorkloadSpec:
    return WorkloadSpec(name, "team", "bench", (TaskGroup(gpu=1),), **fields)


def resolve_now(store: Store) -> None:
    """What a look at held work costs when it must look (something changed)."""
    with store.write(relevant=False) as session:
        lifecycle.resolve_holds(session)


def store_figures(root: Path, workloads: int, nodes: int) -> dict[str, float]:
    store = Store(f"sqlite:///{root / 'corral.db'}")
    store.create_queue(Queue("team"))
    for n in range(nodes):
        devices = tuple(Device(i, f"u-{n}-{i}", "generic", 80 << 30, True) for i in range(8))
        store.register_node(NodeSpec(Node(f"n{n}", gpus=8), devices, virtual=True))
    figures: dict[str, float] = {}
    store.submit_all([spec(f"plain-{i}") for i in range(workloads)])
    figures["snapshot_s_plain"] = timed(store.read_snapshot)
    figures["resolve_idle_s"] = timed(store.resolve_holds)
    store.submit_all([spec(f"arr-{i}", array=ArrayMember("arr", i, 8)) for i in range(workloads)])
    figures["snapshot_s_with_array"] = timed(store.read_snapshot)
    store.submit(spec("first"))
    store.apply(Decisions({"first": (Placement(0, "n0", (0,), 1.0),)}, (), {}, {}))
    store.submit_all([spec(f"held-{i}", after=(Dependency("first"),)) for i in range(workloads)])
    figures["resolve_held_s"] = timed(lambda: resolve_now(store))
    figures["resolve_held_skip_s"] = timed(store.resolve_holds)
    figures["snapshot_s_with_held"] = timed(store.read_snapshot)
    store.close()
    return figures


def estimate_figure(nodes: int) -> float:
    running = tuple(
        Workload(
            f"r{i}",
            "team",
            (TaskGroup(gpu=4),),
            placements=(Placement(0, f"n{i}", (0, 1, 2, 3), 4.0),),
        )
        for i in range(min(100, nodes))
    )
    pending = tuple(
        Workload(f"p{i}", "team", (TaskGroup(gpu=8),), submitted=float(i)) for i in range(20)
    )
    snapshot = Snapshot(
        tuple(Node(f"n{i}", gpus=8) for i in range(nodes)),
        (Queue("team"),),
        running + pending,
    )
    ends = {w.name: 100.0 + i for i, w in enumerate(running)}
    return timed(lambda: estimate_start(snapshot, "p19", ends, 0.0), repeat=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workloads", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = store_figures(Path(folder), args.workloads, args.nodes)
    figures["estimate_s"] = estimate_figure(args.nodes)
    for key, value in figures.items():
        print(f"{key:24} {value * 1000:10.2f} ms")
    if args.json:
        print(json.dumps({key: round(value, 6) for key, value in figures.items()}))


if __name__ == "__main__":
    main()
