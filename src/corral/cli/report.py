"""`corral report usage`: GPU-hours allocated, used and idle, by project, department or user."""

import csv
import sys
from typing import Annotated

import typer
from rich.table import Table

from corral.cli.common import InvalidInput, out_console, print_json, reported_errors
from corral.cli.config import connect
from corral.model.durations import parse_duration
from corral.sdk.types import UsageRowOut

BY = ("project", "department", "user", "workload")
COLUMNS = ("key", "gpu_hours_allocated", "gpu_hours_used", "gpu_hours_idle")

report_app = typer.Typer(
    help="Reports on what the cluster's GPUs did: allocated against used.",
    no_args_is_help=True,
)


@report_app.command("usage")
def usage_command(
    ctx: typer.Context,
    since: Annotated[
        str, typer.Option("--since", help='How far back: seconds, or "24h", "7d", "4w".')
    ] = "7d",
    by: Annotated[
        str, typer.Option("--by", help="Total by project, department, user or workload.")
    ] = "project",
    csv_output: Annotated[bool, typer.Option("--csv", help="Print CSV with a header.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API's JSON.")] = False,
) -> None:
    """GPU-hours allocated, used (weighted by utilisation) and idle (allocated at 0%)."""
    with reported_errors(ctx):
        try:
            parse_duration(since)
        except ValueError as error:
            raise InvalidInput(f"--since: {error}") from None
        if by not in BY:
            raise InvalidInput(f"--by: {by!r} is not one of {', '.join(BY)}")
        with connect() as client:
            rows = client.usage(since, by)
    if json_output:
        print_json(rows)
    elif csv_output:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([row[column] for column in COLUMNS])  # type: ignore[literal-required]
    else:
        _table(rows, by, since)


def _table(rows: list[UsageRowOut], by: str, since: str) -> None:
    if not rows:
        typer.echo(f"No GPU time in the last {since}.")
        return
    table = Table(title=f"GPU-hours by {by}, last {since}")
    table.add_column(by)
    for column in ("allocated", "used", "idle", "used %", "idle %"):
        table.add_column(column, justify="right")
    totals = [0.0, 0.0, 0.0]
    for row in rows:
        allocated = row["gpu_hours_allocated"]
        used = row["gpu_hours_used"]
        idle = row["gpu_hours_idle"]
        totals = [totals[0] + allocated, totals[1] + used, totals[2] + idle]
        table.add_row(row["key"], *_figures(allocated, used, idle))
    if by != "department" and len(rows) > 1:
        table.add_section()
        table.add_row("total", *_figures(*totals))
    out_console().print(table)


def _figures(allocated: float, used: float, idle: float) -> list[str]:
    def share(part: float) -> str:
        return f"{100 * part / allocated:.0f}%" if allocated > 0 else "-"

    return [f"{allocated:.2f}", f"{used:.2f}", f"{idle:.2f}", share(used), share(idle)]
