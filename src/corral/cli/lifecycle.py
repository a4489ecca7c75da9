"""`corral cancel|update|history`, `corral list --start`, and the array and dependency
options of `corral submit`: a workload's life after submission, as Slurm users know it
(scancel, scontrol update, sacct, squeue --start, sbatch --array and --dependency)."""

import csv
import io
import time
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from corral.cli.audit import point_in_time
from corral.cli.common import InProject, InvalidInput, addressed, print_json, reported_errors
from corral.cli.config import connect
from corral.model import PRIORITY_CLASSES, resolve_priority
from corral.model.arrays import parse_array, parse_dependency
from corral.model.durations import format_duration
from corral.sdk import Client
from corral.sdk.types import HistoryOut, WorkloadOut, WorkloadStatus

Name = Annotated[
    str,
    typer.Argument(
        metavar="NAME", help="The workload's (or the array's) name.", show_default=False
    ),
]


HistoryFormat = Literal["table", "json", "csv"]


# -- submit --------------------------------------------------------------------------------


def lifecycle_fields(array: str | None, after: list[str] | None, kill: bool) -> dict[str, Any]:
    """The API fields of `submit --array/--after/--kill-on-invalid-dep`, checked here so
    that a mistake names the option."""
    fields: dict[str, Any] = {}
    if array is not None:
        try:
            parse_array(array)
        except ValueError as error:
            raise InvalidInput(f"--array: {error}") from None
        fields["array"] = array
    for text in after or []:
        try:
            parse_dependency(text)
        except ValueError as error:
            raise InvalidInput(f"--after: {error}") from None
    if after:
        fields["after"] = list(after)
    if kill:
        if not after:
            raise InvalidInput("--kill-on-invalid-dep: give --after too")
        fields["kill_on_invalid_dep"] = True
    return fields


def submitted_text(workload: WorkloadOut) -> str:
    """What `submit` says: the workload, or the array it starts."""
    array = workload.get("array")
    if not array:
        return f"Submitted {workload['name']} to {workload['project']} ({workload['status']})."
    limit = f", at most {array['limit']} running at once" if array["limit"] else ""
    return (
        f"Submitted array {array['name']} to {workload['project']}: workloads "
        f"{array['name']}-INDEX{limit} (see corral list --array {array['name']})."
    )


def describe_rows(workload: WorkloadOut) -> list[tuple[str, str]]:
    """`corral describe`'s lines about the workload's array, dependencies, end, last
    checkpoint and the work its latest preemption lost."""
    rows = []
    array = workload.get("array")
    if array:
        limit = f", at most {array['limit']} running at once" if array["limit"] else ""
        rows.append(("array", f"{array['name']} (index {array['index']}){limit}"))
    if workload.get("after"):
        kill = "; cancelled if one can never be met" if workload["kill_on_invalid_dep"] else ""
        rows.append(("after", ", ".join(workload["after"]) + kill))
    if workload.get("exit_code") is not None:
        rows.append(("exit code", str(workload["exit_code"])))
    if workload.get("cancelled_by"):
        rows.append(("cancelled by", str(workload["cancelled_by"])))
    checkpoint = workload.get("checkpoint_at")
    if checkpoint is not None:
        rows.append(("last checkpoint", _when(checkpoint)))
    lost = workload.get("lost_work")
    if lost:
        rows.append(("preempted", f"{_when(lost['at'])}, {lost['summary']}"))
    return rows


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


# -- cancel, update ------------------------------------------------------------------------


def cancel_command(ctx: typer.Context, name: Name, project: InProject = None) -> None:
    """Stop a workload (or every unfinished member of an array) and keep its record as
    cancelled; `corral delete` removes a record."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx), connect() as client:
        cancelled = client.cancel(name)
    for workload in cancelled:
        typer.echo(f"Cancelled {workload['name']}.")


def update_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The workload's name.")],
    project: InProject = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority", metavar="CLASS|N", help=f"{', '.join(PRIORITY_CLASSES)}, or a number."
        ),
    ] = None,
    preemptible: Annotated[
        bool | None,
        typer.Option("--preemptible/--non-preemptible", help="May it be stopped for others?"),
    ] = None,
    max_runtime: Annotated[
        str | None,
        typer.Option("--max-runtime", metavar="DURATION", help="Stop it after: 90m, 4h, 2d."),
    ] = None,
    backoff_limit: Annotated[
        int | None,
        typer.Option("--backoff-limit", min=0, max=100, help="Failed runs retried."),
    ] = None,
    grace_period: Annotated[
        str | None,
        typer.Option("--grace-period", metavar="DURATION", help="From SIGTERM to SIGKILL."),
    ] = None,
    node_pools: Annotated[
        list[str] | None,
        typer.Option(
            "--node-pool",
            metavar="POOL",
            help="The node pools it may run in, in order of preference (repeatable).",
        ),
    ] = None,
    any_pool: Annotated[
        bool, typer.Option("--any-pool", help="It may run in every pool again.")
    ] = False,
) -> None:
    """Change a pending or suspended workload (running work cannot change)."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx):
        changes: dict[str, Any] = {}
        if priority is not None:
            try:
                resolve_priority(priority)
            except ValueError as error:
                raise InvalidInput(f"--priority: {error}") from None
            changes["priority"] = priority if priority in PRIORITY_CLASSES else int(priority)
        if preemptible is not None:
            changes["preemptible"] = preemptible
        if max_runtime is not None:
            changes["max_runtime"] = max_runtime
        if backoff_limit is not None:
            changes["backoff_limit"] = backoff_limit
        if grace_period is not None:
            changes["grace_period"] = grace_period
        if node_pools and any_pool:
            raise InvalidInput("give --node-pool or --any-pool, not both")
        if node_pools or any_pool:
            changes["node_pools"] = node_pools or []
        if not changes:
            raise InvalidInput("give something to change, e.g. --priority 100")
        with connect() as client:
            workload = client.update_workload(name, changes)
    typer.echo(f"Updated {workload['name']} ({workload['status']}).")


# -- history -------------------------------------------------------------------------------

COLUMNS = (
    "name", "project", "user", "state", "gpus", "wait", "run", "gpu_hours", "exit_code",
    "attempts", "evictions", "submitted", "reason",
)  # fmt: skip


def history_command(
    ctx: typer.Context,
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Only this project's work.")
    ] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's.")] = None,
    state: Annotated[
        WorkloadStatus | None, typer.Option("--state", help="Only work in this state.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Submitted or ended since: 2h, 7d (ago) or an ISO time."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10000, help="Newest rows.")] = 1000,
    output: Annotated[
        HistoryFormat, typer.Option("--output", "-o", help="table, json or csv.")
    ] = "table",
) -> None:
    """Every workload kept, finished or not, like sacct: wait and run time, GPU-hours,
    exit code, attempts, evictions."""
    with reported_errors(ctx):
        filters: dict[str, str | float | int | None] = {
            "project": project,
            "user": user,
            "state": state,
            "since": point_in_time("--since", since, time.time()) if since else None,
            "limit": limit,
        }
        with connect() as client:
            rows = client.history(**filters)
    if output == "json":
        print_json(rows)
    elif output == "csv":
        typer.echo(history_csv(rows), nl=False)
    elif not rows:
        typer.echo("No workloads.")
    else:
        Console().print(_history_table(rows))


def history_csv(rows: list[HistoryOut]) -> str:
    """Every field of every row, with a header line; times in seconds since the epoch."""
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()


def _history_table(rows: list[HistoryOut]) -> Table:
    table = Table()
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["name"],
            row["project"],
            row["user"],
            row["state"],
            f"{row['gpus']:g}",
            _span(row["wait_seconds"]),
            _span(row["run_seconds"]),
            f"{row['gpu_hours']:.2f}",
            "-" if row["exit_code"] is None else str(row["exit_code"]),
            str(row["attempts"]),
            str(row["evictions"]),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(row["submitted_at"])),
            row["reason"] or "",
        )
    return table


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "0s" if seconds < 0.5 else format_duration(seconds)


# -- list --start --------------------------------------------------------------------------


def print_starts(client: Client, project: str | None, json_output: bool) -> None:
    """`corral list --start`: each pending workload with its estimated start."""
    starts = client.starts(project)
    if json_output:
        print_json(starts)
        return
    if not starts:
        typer.echo("No pending workloads.")
        return
    now = time.time()
    table = Table()
    for column in ("workload", "project", "start", "in", "why"):
        table.add_column(column)
    for start in starts:
        at = start["estimated_start"]
        table.add_row(
            start["workload"],
            start["project"],
            "unknown" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)),
            "-" if at is None else ("now" if at <= now + 1 else format_duration(at - now)),
            start["why"],
        )
    Console().print(table)
