"""What a task's walls cost at its start and end: a real agent starts `date`, one task at a
time, without walls (as corral ran tasks before them) and with them (its cgroup made and
entered, a process namespace, its output copied into a capped log), and the times are
measured from the order to start to the task's start report, to its command running (the
time `date` prints), and to its end report. On a loaded machine the least of each moves
less than the median; both are printed.

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


def run(walls: bool, tasks: int) -> dict[str, list[float]]:
    """Seconds to each start report, command and end report."""
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
    found: dict[str, list[float]] = {"start": [], "command": [], "end": []}
    command = ("date", "+%s.%N")
    try:
        for number in range(tasks):
            clock.started.clear()
            clock.ended.clear()
            began, wall = time.perf_counter(), time.time()
            launch = TaskLaunch(f"t{number}", "p", 0, 0, "n", (), 0, command, unix_user="root")
            agent.start([launch])
            clock.started.wait(30)
            found["start"].append(time.perf_counter() - began)
            clock.ended.wait(30)
            found["end"].append(time.perf_counter() - began)
            printed = float(agent.log_path(launch.directory, 0).read_text().split()[0])
            found["command"].append(printed - wall)
    finally:
        agent.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args()
    figures = {}
    for name, walls in (("without walls", False), ("with walls", True)):
        found = run(walls, arguments.tasks)
        figures[name] = {
            f"{key}_{how.__name__}_ms": round(1000 * how(values), 1)
            for key, values in found.items()
            for how in (statistics.median, min)
        }
        shown = ", ".join(
            f"{key} {1000 * statistics.median(values):.1f} ms ({1000 * min(values):.1f})"
            for key, values in found.items()
        )
        print(f"{name:14} {shown}: medians of {arguments.tasks} (least)")
    if arguments.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
