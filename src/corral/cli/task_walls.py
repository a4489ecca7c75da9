"""The options of the walls around tasks (docs/security.md) that `corral up` and
`corral server --ray` share: they reach every agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from corral.cli.common import EXIT_INVALID

if TYPE_CHECKING:
    from corral.agent.walls import WallOptions

LogCap = Annotated[
    str,
    typer.Option(
        "--log-cap",
        help="The most of each task's output kept on disk; beyond it the oldest is dropped, "
        "and a marker line says how much.",
    ),
]
TaskPids = Annotated[
    int,
    typer.Option(
        "--task-pids",
        min=16,
        help="The most processes and threads a task may have at once (agents run as root).",
    ),
]
NoTaskLimits = Annotated[
    bool,
    typer.Option(
        "--no-task-limits",
        help="Run tasks without their cgroup (memory, CPU, pids, devices) and process "
        "namespace, as corral does when it is not root.",
    ),
]


def wall_options(log_cap: str, task_pids: int, no_task_limits: bool) -> WallOptions:
    """The walls of every task, from `--log-cap`, `--task-pids` and `--no-task-limits`; a
    cap too small to hold a page of output is refused."""
    from corral.agent.logcap import MIN_LOG_CAP
    from corral.agent.walls import WallOptions
    from corral.model import format_memory, parse_memory

    try:
        cap = parse_memory(log_cap)
    except ValueError as error:
        typer.secho(f"--log-cap: {error}", fg="red", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    if cap < MIN_LOG_CAP:
        least = format_memory(MIN_LOG_CAP)
        typer.secho(f"--log-cap: {log_cap} is less than {least}", fg="red", err=True)
        raise typer.Exit(EXIT_INVALID)
    return WallOptions(cap, task_pids, not no_task_limits)
