"""What an agent tells the server of its tasks' starts and ends, as calls it makes one by
one (one that fails loses no other: see Agent._report)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from functools import partial

from corral.agent.process import TaskProcess
from corral.messages import Reports, TaskLaunch

# What is reported, and the call that reports it.
Call = tuple[str, Callable[[], None]]


def started(
    reports: Reports, node: str, launch: TaskLaunch, process: TaskProcess, ports: Mapping[str, int]
) -> list[Call]:
    """A task's start (its launcher's pid and start time), and its ports when it has any."""
    calls: list[Call] = [
        (
            "task started",
            partial(
                reports.task_started,
                node,
                launch.workload,
                launch.task,
                process.pid,
                process.proc_start,
            ),
        )
    ]
    if ports:
        calls.append(
            ("task ports", partial(reports.task_ports, node, launch.workload, launch.task, ports))
        )
    return calls


def ended(
    reports: Reports,
    node: str,
    launch: TaskLaunch,
    exit_code: int | None,
    reason: str,
    cause: str | None,
) -> Call:
    """A task's end, with the attempt, launch and directory it was launched with."""
    return (
        "task ended",
        partial(
            reports.task_ended,
            node,
            launch.workload,
            launch.task,
            exit_code,
            reason,
            launch.attempt,
            launch.launch,
            cause,
            launch.directory,
        ),
    )


def exit_reason(code: int) -> str:
    """How a task ended, by its exit code (128 + N: killed by signal N)."""
    if code == 0:
        return "exited with code 0"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"killed by {name}"
    return f"exited with code {code}"
