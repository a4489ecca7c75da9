"""`corral list|describe|delete|suspend|resume|why`: workloads after submission."""

import shlex
import time
from typing import Annotated

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from corral.cli.attempts import attempts_json, attempts_of, attempts_table, retries_line
from corral.cli.common import (
    InProject,
    OutputFormat,
    addressed,
    format_when,
    out_console,
    print_json,
    printed_as_data,
    reported_errors,
)
from corral.cli.config import connect
from corral.cli.lifecycle import describe_rows, print_starts
from corral.model import PRIORITY_CLASSES, format_gpus, format_memory
from corral.model.durations import format_duration
from corral.model.resources import plural_gpus
from corral.sdk.types import EventOut, TaskGroupOut, WhyOut, WorkloadOut, WorkloadStatus

STATUS_STYLES = {
    "pending": "yellow",
    "running": "green",
    "suspended": "magenta",
    "succeeded": "blue",
    "failed": "red",
    "cancelled": "bright_black",
}
# The class name that shows each priority number; the first listed name wins a tie.
_CLASS_OF: dict[int, str] = {}
for _name, _number in PRIORITY_CLASSES.items():
    _CLASS_OF.setdefault(_number, _name)

Name = Annotated[
    str, typer.Argument(metavar="NAME", help="The workload's name.", show_default=False)
]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]


def list_command(
    ctx: typer.Context,
    all_projects: Annotated[
        bool, typer.Option("--all-projects", "-A", help="Workloads of every project.")
    ] = False,
    project: Annotated[
        str | None,
        typer.Option(
            "--project", "-p", help="Workloads of this project.", show_default="your project"
        ),
    ] = None,
    status: Annotated[
        WorkloadStatus | None,
        typer.Option("--status", help="Only workloads in this state.", show_default=False),
    ] = None,
    json_output: JsonOutput = False,
    array: Annotated[
        str | None,
        typer.Option("--array", metavar="NAME", help="Only the members of this array."),
    ] = None,
    start: Annotated[
        bool,
        typer.Option("--start", help="Pending work with its estimated start (squeue --start)."),
    ] = False,
    output: OutputFormat = "table",
) -> None:
    """Workloads of your project, oldest first (an admin or viewer sees every project's)."""
    with reported_errors(ctx), connect() as client:
        if project is None and not all_projects:
            project = client.whoami()["project"]
        if start:
            print_starts(client, project, json_output)
            return
        workloads = client.list_workloads(project, status, array=array)
        if printed_as_data(workloads, output, json_output):
            return
    if not workloads:
        where = "" if project is None else f" in {project}"
        typer.echo(f"No workloads{where}.")
        return
    now = time.time()
    table = Table()
    for column in (
        "workload", "project", "user", "status", "workers", "gpus", "priority", "age", "nodes",
        "reason",
    ):  # fmt: skip
        table.add_column(column)
    wide = output == "wide"
    if wide:
        for column in WIDE_LIST_COLUMNS:
            table.add_column(column)
    for workload in workloads:
        nodes = dict.fromkeys(placement["node"] for placement in workload["placements"])
        total = sum(group["replicas"] for group in workload["tasks"])
        table.add_row(
            workload["name"],
            workload["project"],
            workload["user"],
            _status(workload["status"]),
            f"{len(workload['placements'])}/{total}",
            ", ".join(_request(group) for group in workload["tasks"]),
            _priority_name(workload["priority"]),
            _age(now - workload["created_at"]),
            ", ".join(nodes),
            workload["reason"] or "",
            *(wide_list_cells(workload) if wide else ()),
        )
    out_console().print(table)


WIDE_LIST_COLUMNS = ("preemptible", "attempts", "max runtime", "workdir", "command")


def wide_list_cells(workload: WorkloadOut) -> tuple[str, ...]:
    """The cells `corral list -o wide` adds."""
    runtime = workload["max_runtime"]
    return (
        "yes" if workload["preemptible"] else "no",
        str(workload["attempts"]),
        "-" if runtime is None else format_duration(runtime),
        workload["workdir"] or "-",
        shlex.join(workload["command"]),
    )


def describe_command(
    ctx: typer.Context,
    name: Name,
    project: InProject = None,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print {"workload": ..., "attempts": [...], "events": [...]}: the API\'s '
            "workload and events, and the attempts found in them.",
        ),
    ] = False,
) -> None:
    """A workload's spec, status, placement, attempts (every run, with how it ended and
    why) and events."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx), connect() as client:
        workload = client.get_workload(name)
        events = client.events(name)
    attempts = attempts_of(workload, events)
    if json_output:
        print_json({"workload": workload, "attempts": attempts_json(attempts), "events": events})
        return
    console = out_console()
    console.print(_spec(workload))
    console.print(_tasks_table(workload["tasks"], workload["min_available"]))
    if workload["placements"]:
        table = Table(title="Placement", title_justify="left")
        for column in ("task", "node", "devices", "gpus"):
            table.add_column(column)
        for placement in workload["placements"]:
            table.add_row(
                str(placement["task"]),
                placement["node"],
                ",".join(map(str, placement["devices"])) or "-",
                format_gpus(placement["gpu"]),
            )
        console.print(table)
    if attempts:
        console.print(attempts_table(attempts))
    console.print(_events_table(events) if events else Text("No events."))


def delete_command(ctx: typer.Context, name: Name, project: InProject = None) -> None:
    """Delete a workload and its record; its tasks are stopped if they run. To stop one
    and keep its record (as cancelled), use corral cancel."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx), connect() as client:
        client.delete_workload(name)
    typer.echo(f"Deleted {name}.")


def suspend_command(ctx: typer.Context, name: Name, project: InProject = None) -> None:
    """Stop a workload and keep it out of scheduling until it is resumed."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx), connect() as client:
        workload = client.suspend(name)
    typer.echo(f"Suspended {workload['name']}.")


def resume_command(ctx: typer.Context, name: Name, project: InProject = None) -> None:
    """Put a suspended workload back in its queue."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx), connect() as client:
        workload = client.resume(name)
    typer.echo(f"Resumed {workload['name']} ({workload['status']}).")


def why_command(
    ctx: typer.Context,
    name: Name,
    project: InProject = None,
    json_output: JsonOutput = False,
) -> None:
    """Why a workload waits, its place in its queue, and who holds the GPUs it could use."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx), connect() as client:
        why = client.why(name)
        project = client.get_workload(name)["project"] if why["position"] is not None else ""
    if json_output:
        print_json(why)
        return
    console = out_console()
    for line in _why_lines(why, project):
        console.print(line)
    if why["status"] != "pending":
        return
    for line in why_depth_lines(why):
        console.print(line)
    if why["holders"]:
        table = Table(title="Running on the nodes it may use", title_justify="left")
        for column in ("workload", "project", "priority", "preemptible", "node", "gpus"):
            table.add_column(column)
        table.add_column("may be taken")
        for holder in why["holders"]:
            table.add_row(
                holder["workload"] or "(another project's)",
                holder["project"],
                _priority_name(holder["priority"]),
                "yes" if holder["preemptible"] else "no",
                holder["node"],
                format_gpus(holder["gpu"]),
                holder.get("may_take") or "",
            )
        console.print(table)
    else:
        console.print("Nothing runs on the nodes it may use.")
    if why.get("queues"):
        console.print(why_queues_table(why))
        for line in why_weight_lines(why):
            console.print(line)


def why_depth_lines(why: WhyOut) -> list[Text]:
    """What it needs, and what reclaim and preemption may do for it."""
    lines = [Text(f"It needs {plural_gpus(why.get('needs', 0.0))} at once.")]
    if why.get("reclaim"):
        lines.append(Text(f"Reclaim: {why['reclaim']}."))
    if why.get("preempt"):
        lines.append(Text(f"Preempt: {why['preempt']}."))
    return lines


def why_weight_lines(why: WhyOut) -> list[Text]:
    """Time-decayed fair share: each queue's effective over-quota weight and why."""
    return [
        Text(f"Over-quota weight of {queue['name']}: {reason}.")
        for queue in why.get("queues", [])
        if (reason := queue.get("weight_reason"))
    ]


def why_queues_table(why: WhyOut) -> Table:
    """Its project and the departments above it, in GPUs, as `corral plan` shows queues."""
    table = Table(title="Its queues (GPUs)", title_justify="left")
    table.add_column("queue")
    for column in ("deserved", "limit", "fair share", "allocated"):
        table.add_column(column, justify="right")
    for queue in why.get("queues", []):
        table.add_row(
            queue["name"],
            format_gpus(queue["deserved"]),
            "-" if queue["limit"] is None else format_gpus(queue["limit"]),
            "-" if queue["fair_share"] is None else format_gpus(queue["fair_share"]),
            "-" if queue["allocated"] is None else format_gpus(queue["allocated"]),
        )
    return table


def _why_lines(why: WhyOut, project: str) -> list[Text]:
    status = why["status"]
    headline = Text.assemble((why["workload"], "bold"), " is ", _status(status))
    if why["reason"]:
        headline.append(f": {why['reason']}")
    lines = [headline]
    position = why["position"]
    if position is not None:
        if position == 1:
            lines.append(Text(f"It is the next of {project}'s pending workloads to be tried."))
        else:
            ahead = ", ".join(why["ahead"])
            lines.append(Text(f"It is number {position} in {project}'s queue, after {ahead}."))
    return lines


def _priority_name(priority: int) -> str:
    """ "train (50)" for a class's number, else the number."""
    name = _CLASS_OF.get(priority)
    return f"{name} ({priority})" if name else str(priority)


def _status(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(status, ""))


def _request(group: TaskGroupOut) -> str:
    """What one worker asks for: "1", "0.5" or "20GiB" (of one GPU's memory)."""
    if group["gpu_memory"]:
        return format_memory(group["gpu_memory"])
    return format_gpus(group["gpu"])


def _age(seconds: float) -> str:
    seconds = max(seconds, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _spec(workload: WorkloadOut) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    status: RenderableType = _status(workload["status"])
    if workload["reason"]:
        status = Text.assemble(_status(workload["status"]), f": {workload['reason']}")
    preemptible = "preemptible" if workload["preemptible"] else "not preemptible"
    rows: list[tuple[str, RenderableType]] = [
        ("workload", workload["name"]),
        ("project", workload["project"]),
        ("user", workload["user"]),
        ("status", status),
        ("priority", f"{_priority_name(workload['priority'])}, {preemptible}"),
        ("command", " ".join(workload["command"]) or "-"),
    ]
    if workload["workdir"]:
        rows.append(("workdir", workload["workdir"]))
    if workload["env"]:
        rows.append(("env", Group(*(f"{k}={v}" for k, v in workload["env"].items()))))
    if workload["secrets"]:
        # Names only: the values never leave the server but into the task.
        refs = (f"{k} <- secret {v}" for k, v in workload["secrets"].items())
        rows.append(("secrets", Group(*refs)))
    if workload["node_selector"]:
        selector = (f"{k} in {', '.join(v)}" for k, v in workload["node_selector"].items())
        rows.append(("node selector", "; ".join(selector)))
    if workload.get("node_pools"):
        rows.append(("node pools", ", ".join(workload["node_pools"])))
    if workload["topology"]:
        kind = "required" if workload["topology"]["required"] else "preferred"
        rows.append(("topology", f"{workload['topology']['key']} ({kind})"))
    if workload["max_runtime"] is not None:
        rows.append(("max runtime", _duration(workload["max_runtime"])))
    rows += describe_rows(workload)
    rows += [
        ("attempts", str(workload["attempts"])),
        ("retries", retries_line(workload)),
        ("created", format_when(workload["created_at"])),
        ("started", format_when(workload["started_at"])),
        ("finished", format_when(workload["finished_at"])),
    ]
    for key, value in rows:
        grid.add_row(key, value)
    return grid


def _tasks_table(groups: list[TaskGroupOut], min_available: int | None) -> Table:
    title = "Tasks" if min_available is None else f"Tasks (elastic: at least {min_available})"
    table = Table(title=title, title_justify="left")
    for column in ("group", "workers", "gpus", "gpu memory", "cpus", "memory"):
        table.add_column(column)
    for group in groups:
        table.add_row(
            group["name"],
            str(group["replicas"]),
            format_gpus(group["gpu"]),
            format_memory(group["gpu_memory"]) if group["gpu_memory"] else "-",
            f"{group['cpu']:g}",
            format_memory(group["memory"]) if group["memory"] else "-",
        )
    return table


def _events_table(events: list[EventOut]) -> Table:
    table = Table(title="Events", title_justify="left")
    for column in ("time", "event", "by", "detail"):
        table.add_column(column)
    for event in events:
        detail = event["reason"]
        if event["node"]:
            detail = f"{detail} (node {event['node']})" if detail else f"node {event['node']}"
        table.add_row(format_when(event["time"]), event["kind"], event["cause"], detail)
    return table
