"""The options of the walls around tasks (docs/security.md), and of where the nodes'
Python environments take packages from (docs/workloads.md), that `corral up` and
`corral server --ray` share: they reach every agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from corral.cli.common import EXIT_INVALID

if TYPE_CHECKING:
    from corral.agent.prepare import NodeIndex
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


NodeIndexUrl = Annotated[
    str | None,
    typer.Option(
        "--index-url",
        metavar="URL|DIR",
        help="The package index the nodes build workloads' Python environments from, "
        "instead of PyPI (a URL, or a directory of this machine's).",
        show_default="PyPI",
    ),
]
NodeFindLinks = Annotated[
    list[str] | None,
    typer.Option(
        "--find-links",
        metavar="URL|DIR",
        help="A page or directory of packages the nodes' environments may take, after a "
        "workload's own. Repeatable.",
    ),
]


def node_index(index_url: str | None, find_links: list[str] | None) -> NodeIndex:
    """The nodes' package sources from `--index-url` and `--find-links`: URLs, or absolute
    directories (an admin's, read on each node)."""
    from corral.agent.prepare import NodeIndex

    given = [("--index-url", index_url), *(("--find-links", link) for link in find_links or ())]
    for option, value in given:
        if value is not None and not value.startswith(("http://", "https://", "/")):
            problem = f"{option}: {value!r} is neither a URL nor an absolute directory"
            typer.secho(problem, fg="red", err=True)
            raise typer.Exit(EXIT_INVALID)
    return NodeIndex(index_url, tuple(find_links or ()))


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
