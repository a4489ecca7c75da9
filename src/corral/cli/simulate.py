"""`corral simulate SCENARIO --trace T --policy P ...`: replay a trace on the scenario's
cluster under each policy, offline, and compare them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from corral.cli.common import EXIT_INVALID, out_console, reported_errors
from corral.sim.errors import SimError
from corral.sim.names import POLICIES

if TYPE_CHECKING:
    from corral.sim import Cluster, SimResult, SimSettings, Trace


def simulate(
    ctx: typer.Context,
    scenario: Annotated[
        Path,
        typer.Argument(
            metavar="SCENARIO",
            help="The cluster and its queues (a scenario file).",
            show_default=False,
        ),
    ],
    trace: Annotated[
        str,
        typer.Option(
            "--trace",
            metavar="NAME_OR_PATH",
            help="philly, gavel, openb[:VARIANT], helios, synthetic, or a trace file.",
            show_default=False,
        ),
    ],
    policies: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            metavar="POLICY",
            help=f"Repeat to compare: {', '.join(POLICIES)}. Default: corral.",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="DIR", help="Write report.json, report.md and plots here."),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between scheduling cycles.")
    ] = 10.0,
    checkpoint: Annotated[
        float,
        typer.Option(
            "--checkpoint-interval", help="Seconds of progress per checkpoint (0: nothing is lost)."
        ),
    ] = 1800.0,
    restart_cost: Annotated[
        float, typer.Option("--restart-cost", help="Seconds a preempted job needs to restart.")
    ] = 60.0,
    jobs: Annotated[
        int | None, typer.Option("--jobs", help="Replay only the first N jobs of the trace.")
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the synthetic trace and the random scorer.")
    ] = 0,
) -> None:
    """Replay a workload trace on a scenario's cluster under one or more policies.

    Prints a table comparing the policies; with --out, also writes a report and plots.
    Exits 2 when the scenario, the trace or a policy cannot be used.
    """
    # The scenario, the simulator and the trace loaders load the engine and numpy: only
    # this command needs them.
    from corral.scenario import load_scenario
    from corral.sim import SimSettings, check_projects, cluster_from_scenario, load_trace
    from corral.sim.report import Inputs, write_report

    chosen = policies or ["corral"]
    console = out_console()
    with reported_errors(ctx):
        try:
            for at, name in enumerate(chosen):
                if name not in POLICIES:
                    raise SimError(
                        "--policy", f'unknown policy "{name}" (policies: {", ".join(POLICIES)})'
                    )
                if name in chosen[:at]:
                    raise SimError("--policy", f'"{name}" is given twice')
            if interval <= 0:
                raise SimError("--interval", "must be more than 0 seconds")
            loaded = load_scenario(scenario)
            replay = load_trace(trace, seed=seed)
            if jobs is not None:
                replay = replay.head(jobs)
            cluster = cluster_from_scenario(loaded, replay)
            check_projects(cluster, replay, str(scenario))
        except SimError as error:
            typer.echo(str(error), err=True)
            raise typer.Exit(EXIT_INVALID) from None
        if loaded.snapshot.workloads:
            console.print(
                Text(
                    f"The scenario's {len(loaded.snapshot.workloads)} workloads are not "
                    "simulated: the trace supplies the work.",
                    style="dim",
                )
            )
        settings = SimSettings(
            cycle_interval=interval, checkpoint_interval=checkpoint, restart_cost=restart_cost
        )
        results = _run_all(chosen, cluster, replay, settings, seed)
        console.print(_summary_table(loaded.name, replay.name, results))
        if out is not None:
            inputs = Inputs(loaded.name, replay.name, replay.source, settings)
            paths = write_report(out, inputs, results)
            console.print(f"Report written to {out}: " + ", ".join(p.name for p in paths.values()))


def _run_all(
    chosen: list[str], cluster: Cluster, replay: Trace, settings: SimSettings, seed: int
) -> list[SimResult]:
    """Each policy in turn, with a progress bar over virtual time (on stderr)."""
    from corral.sim import prepare
    from corral.sim import simulate as run_simulation
    from corral.sim.report import duration

    results = []
    columns = (
        TextColumn("{task.description:>10}"),
        BarColumn(),
        TextColumn("{task.fields[clock]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        for name in chosen:
            task = progress.add_task(name, total=replay.span or 1.0, clock="")

            def advance(now: float, task: TaskID = task) -> None:
                progress.update(task, completed=now, clock=f"{duration(now)} of virtual time")

            setup = prepare(name, cluster, seed)
            results.append(run_simulation(setup, replay, cluster.quotas(), settings, advance))
            progress.update(task, completed=replay.span or 1.0)
    return results


def _summary_table(scenario: str, trace: str, results: list[SimResult]) -> Table:
    from corral.sim.report import summary_rows

    table = Table(title=f"{scenario} with trace {trace}", title_justify="left")
    table.add_column("")
    for result in results:
        table.add_column(result.policy, justify="right")
    for label, cells in summary_rows(results):
        table.add_row(label, *cells)
    return table
