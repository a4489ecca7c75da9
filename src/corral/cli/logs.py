"""`corral logs NAME [-f] [--task I] [--tail N]`: a task's output."""

import re
import time
from typing import Annotated

import typer

from corral.cli.common import InProject, addressed, reported_errors
from corral.cli.config import connect
from corral.sdk import Client

_ANSI_CURSOR = re.compile(r"\x1b\[[0-9;]*[A-HJKf]")


def render(text: str) -> str:
    """Output as a terminal would leave it: a carriage return starts the line over, so a
    progress bar shows only its last state instead of every redraw."""
    lines = []
    for line in text.split("\n"):
        line = _ANSI_CURSOR.sub("", line)
        if "\r" in line:
            parts = [part for part in line.split("\r") if part]
            line = parts[-1] if parts else ""
        lines.append(line)
    return "\n".join(lines)


def logs_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The workload.")],
    project: InProject = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output.")
    ] = False,
    task: Annotated[int, typer.Option("--task", min=0, help="Which task (default 0).")] = 0,
    tail: Annotated[
        int | None, typer.Option("--tail", min=1, help="Only the last N lines to start with.")
    ] = None,
) -> None:
    """Print a task's output; with -f, keep printing until the workload ends."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx), connect() as client:
        chunk = client.logs(name, task=task, tail=tail)
        if not chunk["text"]:
            say_not_started(client, name)
        pending = chunk["text"]
        offset = chunk["offset"]
        while True:
            # Hold back a partial last line: its carriage returns may not be finished.
            complete, _, rest = pending.rpartition("\n")
            if complete:
                typer.echo(render(complete))
            pending = rest
            if not follow:
                break
            if client.get_workload(name)["status"] not in ("pending", "running"):
                chunk = client.logs(name, task=task, offset=offset)
                pending += chunk["text"]
                if pending:
                    typer.echo(render(pending))
                break
            time.sleep(1.0)
            chunk = client.logs(name, task=task, offset=offset)
            pending += chunk["text"]
            offset = chunk["offset"]
        if not follow and pending:
            typer.echo(render(pending))


def say_not_started(client: Client, name: str) -> None:
    """On stderr (stdout stays the log), when a workload has not started: that it has not,
    and why it waits."""
    workload = client.get_workload(name)
    if workload["status"] != "pending" or workload["started_at"] is not None:
        return
    reason = workload["reason"] or "the scheduler has not looked at it yet"
    typer.echo(f"{name} has not started: it is pending ({reason}); see corral why {name}", err=True)
