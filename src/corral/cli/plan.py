"""`corral plan FILE`: what the scheduler would do with a scenario file, offline."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from corral.cli.common import EXIT_CHECK_FAILED, out_console, reported_errors
from corral.model import Placement, format_gpus

if TYPE_CHECKING:
    from corral.scenario import PlanResult, QueueOutcome, Scenario


def plan_command(
    ctx: typer.Context,
    file: Annotated[
        Path, typer.Argument(metavar="FILE", help="The scenario file (YAML).", show_default=False)
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print only the outcome, as JSON.")
    ] = False,
) -> None:
    """Run the scheduler on a scenario file, cycle after cycle, and show the outcome.

    Exits 0 when the file has no expectations or all of them hold, 1 when one fails,
    2 when the file is invalid.
    """
    # The runner loads the engine: only this command needs it.
    from corral.scenario import check_expectations, load_scenario, plan

    with reported_errors(ctx):
        scenario = load_scenario(file)
        result = plan(scenario)
        failures = check_expectations(scenario, result)
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
        # stdout stays pure JSON; which expectations failed goes to stderr.
        for failure in failures:
            typer.echo(f"expectation failed: {failure}", err=True)
    else:
        _show(out_console(), scenario, result, failures)
    if failures:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _show(console: Console, scenario: Scenario, result: PlanResult, failures: list[str]) -> None:
    cycles = "1 cycle" if result.cycles == 1 else f"{result.cycles} cycles"
    console.print(Text.assemble((scenario.name, "bold"), f" ({cycles})"))
    if scenario.description:
        console.print(Text(scenario.description, style="dim"))
    console.print(_workloads_table(scenario, result))
    console.print(_evictions_table(result) if result.evictions else Text("No evictions."))
    if result.queues:
        console.print(_queues_table("Queues (GPUs)", result.queues))
    for pool, queues in result.pools.items():
        console.print(_queues_table(f"Queues in pool {pool} (GPUs)", queues))
    _show_expectations(console, scenario, failures)


def _workloads_table(scenario: Scenario, result: PlanResult) -> Table:
    table = Table(title="Workloads", title_justify="left")
    for column in ("workload", "queue", "status", "nodes", "gpus", "reason"):
        table.add_column(column)
    for workload in scenario.snapshot.workloads:
        outcome = result.workloads[workload.name]
        running = outcome.status == "running"
        table.add_row(
            Text(workload.name),
            Text(workload.queue),
            Text(outcome.status, style="green" if running else "yellow"),
            Text(", ".join(outcome.nodes)),
            Text(", ".join(_devices(placement) for placement in outcome.placements)),
            Text(outcome.reason or ""),
        )
    return table


def _devices(placement: Placement) -> str:
    """Device indices of one task: 0,1 for whole devices, 0 (0.5) for half of device 0."""
    indices = ",".join(str(index) for index in placement.devices) or "-"
    if 0 < placement.gpu < 1:
        return f"{indices} ({format_gpus(placement.gpu)})"
    return indices


def _evictions_table(result: PlanResult) -> Table:
    table = Table(title="Evictions", title_justify="left")
    for column in ("cycle", "workload", "action", "by", "reason"):
        table.add_column(column)
    for record in result.evictions:
        table.add_row(
            Text(str(record.cycle)),
            Text(record.workload),
            Text(record.action),
            Text(record.by or "-"),
            Text(record.reason),
        )
    return table


def _queues_table(title: str, queues: Mapping[str, QueueOutcome]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("queue")
    # The weight column appears only where time-decayed fair share is on somewhere.
    weighted = any(queue.weight is not None for queue in queues.values())
    columns = ("deserved", "fair share", "allocated", *(("weight",) if weighted else ()))
    for column in columns:
        table.add_column(column, justify="right")
    for name, queue in queues.items():
        cells = [
            Text(name),
            Text(format_gpus(queue.deserved)),
            Text(format_gpus(queue.fair_share)),
            Text(format_gpus(queue.allocated)),
        ]
        if weighted:
            cells.append(Text("-" if queue.weight is None else f"{queue.weight:.3g}"))
        table.add_row(*cells)
    return table


def _show_expectations(console: Console, scenario: Scenario, failures: list[str]) -> None:
    if scenario.expectations is None:
        console.print("No expectations to check.")
    elif not failures:
        console.print(Text("All expectations hold.", style="green"))
    else:
        count = "1 expectation" if len(failures) == 1 else f"{len(failures)} expectations"
        console.print(Text(f"{count} failed:", style="bold red"))
        for failure in failures:
            # Padding keeps a wrapped message indented under its first line.
            console.print(Padding(Text(f"✗ {failure}", style="red"), (0, 0, 0, 2)))
