"""What a task's walls cost at its start and end: a real agent starts `true`, one task at a
time, without walls (as corral ran tasks before them) and with them (its cgroup made and
entered, a process namespace, its output copied into a capped log), and the times are
measured from the order to start to the task's start report, and to its end report.

    sudo python benchmarks/task_walls.py [--tasks N] [--json]

Root is needed for the walls; without it both rows are without walls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from corral.agent import Agent
from corral.agent.walls import WallOptions, Walls
from corral.messages import TaskLaunch
from corral.model.telemetry import Sample


class Clock:
    """The agent's reports, timed."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.ended = threading.Event()

    def task_started(self, *_: object) -> None:
        self.started.set()

    def task_ended(self, *_: object, **__: object) -> None:
        self.ended.set()

    def heartbeat(self, node: str) -> None:
        pass

    def samples(self, node: str, samples: list[Sample]) -> None:
        pass

    def checkpoints(self, node: str, times: Mapping[str, float]) -> None:
        pass


def run(walls: bool, tasks: int) -> tuple[list[float], list[float]]:
    """Seconds to each start report and to each end report."""
    folder = Path(tempfile.mkdtemp(prefix="corral-bench-walls-"))
    clock = Clock()
    # Without walls as corral ran tasks before them: no log cap either (no copying).
    options = WallOptions() if walls else WallOptions(log_cap=0, limits=False)
    made = Walls(folder / "data", (), options)
    agent = Agent(
        "n",
        folder / "data",
        reports=clock,
        poll_interval=0.01,
        workloads_dir=folder / "workloads",
        walls=made,
    )
    agent.start_thread()
    starts, ends = [], []
    try:
        for number in range(tasks):
            clock.started.clear()
            clock.ended.clear()
            began = time.perf_counter()
            launch = TaskLaunch(f"t{number}", "p", 0, 0, "n", (), 0, ("true",), unix_user="root")
            agent.start([launch])
            clock.started.wait(30)
            starts.append(time.perf_counter() - began)
            clock.ended.wait(30)
            ends.append(time.perf_counter() - began)
    finally:
        agent.close()
    return starts, ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args()
    figures = {}
    for name, walls in (("without walls", False), ("with walls", True)):
        starts, ends = run(walls, arguments.tasks)
        figures[name] = {
            "start_ms": round(1000 * statistics.median(starts), 1),
            "end_ms": round(1000 * statistics.median(ends), 1),
        }
        print(
            f"{name:14} start report {figures[name]['start_ms']:7.1f} ms, "
            f"end report {figures[name]['end_ms']:7.1f} ms (medians of {arguments.tasks})"
        )
    if arguments.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
