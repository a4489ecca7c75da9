"""A comparison of policies as files: `report.json` (every figure), `report.md` (tables
for people) and PNG plots.

Durations in the JSON are seconds, GPU amounts GPUs, shares fractions of one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from corral.sim.metrics import HOUR, SimResult, Stats
from corral.sim.simulator import SimSettings

PLOTS = {
    "allocation": "allocation.png",
    "queueing_delay": "queueing_delay.png",
    "usage_vs_quota": "usage_vs_quota.png",
}


@dataclass(frozen=True, slots=True)
class Inputs:
    """What was simulated, for the report's heading."""

    scenario: str
    trace: str
    trace_source: str
    settings: SimSettings


def report_json(inputs: Inputs, results: Sequence[SimResult]) -> dict[str, object]:
    """The whole comparison as plain JSON values."""
    first = results[0]
    settings = inputs.settings
    return {
        "scenario": inputs.scenario,
        "trace": {
            "name": inputs.trace,
            "source": inputs.trace_source,
            "jobs": first.jobs,
            "window_hours": _round(first.window / HOUR),
            "projects": list(first.projects),
        },
        "settings": {
            "cycle_interval": settings.cycle_interval,
            "checkpoint_interval": settings.checkpoint_interval,
            "restart_cost": settings.restart_cost,
            "horizon": settings.horizon,
        },
        "policies": {result.policy: _policy_json(result) for result in results},
    }


def _policy_json(result: SimResult) -> dict[str, object]:
    series = result.series
    busy = series.busy.sum(axis=1) / result.gpus if result.utilisation is not None else None
    return {
        "gpus": result.gpus,
        "jobs": result.jobs,
        "completed": result.completed,
        "unstarted": result.unstarted,
        "allocation": _round(result.allocation),
        "utilisation": _round(result.utilisation),
        "queueing_delay": _stats_json(result.queueing_delay),
        "completion_time": _stats_json(result.completion_time),
        "gpu_hours": _round(result.gpu_hours),
        "mean_pending_gpus": _round(result.mean_pending_gpus),
        "peak_pending_gpus": _round(result.peak_pending_gpus),
        "fairness": _round(result.fairness),
        "preemptions": result.preemptions,
        "evictions_by_action": dict(result.evictions_by_action),
        "lost_gpu_hours": _round(result.lost_gpu_hours),
        "restart_gpu_hours": _round(result.restart_gpu_hours),
        "cycles": result.cycles,
        "skipped_cycles": result.skipped_cycles,
        "wall_seconds": _round(result.wall_seconds),
        "end_hours": _round(result.end / HOUR),
        "projects": {
            name: {
                "quota": project.quota,
                "jobs": project.jobs,
                "completed": project.completed,
                "unstarted": project.unstarted,
                "gpu_hours": _round(project.gpu_hours),
                "mean_gpus": _round(project.mean_gpus),
                "mean_pending_gpus": _round(project.mean_pending_gpus),
                "entitlement_received": _round(project.entitlement_received),
                "queueing_delay": _stats_json(project.queueing_delay),
                "completion_time": _stats_json(project.completion_time),
                "preemptions": project.preemptions,
                "lost_gpu_hours": _round(project.lost_gpu_hours),
            }
            for name, project in result.by_project.items()
        },
        "series": {
            "start_hours": [_round(value / HOUR) for value in series.times],
            "allocation": [_round(value) for value in series.held.sum(axis=1) / result.gpus],
            "utilisation": None if busy is None else [_round(value) for value in busy],
            "pending_gpus": [_round(value) for value in series.pending.sum(axis=1)],
            "project_gpus": {
                name: [_round(value) for value in series.held[:, at]]
                for at, name in enumerate(result.projects)
            },
        },
    }


def _stats_json(values: Stats) -> dict[str, object]:
    return {
        "count": values.count,
        "mean": _round(values.mean),
        "p50": _round(values.p50),
        "p95": _round(values.p95),
        "p99": _round(values.p99),
    }


def _round(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


# -- text --------------------------------------------------------------------------------


def duration(seconds: float | None) -> str:
    """ "42 s", "12 min", "3.5 h", "2.1 d"; "-" when there is nothing to show."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < HOUR:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * HOUR:
        return f"{seconds / HOUR:.2f} h"
    return f"{seconds / (24 * HOUR):.1f} d"


def percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def summary_rows(results: Sequence[SimResult]) -> list[tuple[str, list[str]]]:
    """The rows of the side-by-side summary: a label and one cell per policy."""

    def row(label: str, cell: Callable[[SimResult], str]) -> tuple[str, list[str]]:
        return label, [cell(result) for result in results]

    return [
        row("GPUs", lambda r: number(r.gpus, 0)),
        row("jobs completed", lambda r: f"{r.completed:,} of {r.jobs:,}"),
        row("never started", lambda r: f"{r.unstarted:,}"),
        row("GPU allocation", lambda r: percent(r.allocation)),
        row("GPU utilisation", lambda r: percent(r.utilisation)),
        row("queueing delay, mean", lambda r: duration(r.queueing_delay.mean)),
        row("queueing delay, p50", lambda r: duration(r.queueing_delay.p50)),
        row("queueing delay, p95", lambda r: duration(r.queueing_delay.p95)),
        row("queueing delay, p99", lambda r: duration(r.queueing_delay.p99)),
        row("completion time, mean", lambda r: duration(r.completion_time.mean)),
        row("completion time, p95", lambda r: duration(r.completion_time.p95)),
        row("pending GPUs, mean", lambda r: number(r.mean_pending_gpus)),
        row("preemptions", lambda r: f"{r.preemptions:,}"),
        row("GPU-hours lost to preemption", lambda r: number(r.lost_gpu_hours)),
        row("GPU-hours restarting", lambda r: number(r.restart_gpu_hours)),
        row("fairness (Jain)", lambda r: number(r.fairness, 3)),
        row("cycles run / skipped", lambda r: f"{r.cycles:,} / {r.skipped_cycles:,}"),
        row("seconds to simulate", lambda r: number(r.wall_seconds)),
    ]


def report_markdown(inputs: Inputs, results: Sequence[SimResult]) -> str:
    first = results[0]
    names = [result.policy for result in results]
    lines = [
        f"# Simulation: {inputs.scenario} with trace {inputs.trace}",
        "",
        f"{first.jobs:,} jobs over {duration(first.window)} ({inputs.trace_source}); "
        f"cycles every {inputs.settings.cycle_interval:g} s, checkpoints every "
        f"{duration(inputs.settings.checkpoint_interval)}, restart cost "
        f"{duration(inputs.settings.restart_cost)}.",
        "",
        "## Summary",
        "",
        _table(["", *names], [[label, *cells] for label, cells in summary_rows(results)]),
        "",
        "## Queueing delay by project (mean / p95)",
        "",
        _table(
            ["project", *names],
            [
                [
                    project,
                    *(
                        f"{duration(r.by_project[project].queueing_delay.mean)} / "
                        f"{duration(r.by_project[project].queueing_delay.p95)}"
                        for r in results
                    ),
                ]
                for project in first.projects
            ],
        ),
        "",
        "## Usage against quota (mean GPUs held / quota; GPU-hours)",
        "",
        _table(
            ["project", "quota", *names],
            [
                [
                    project,
                    number(first.by_project[project].quota),
                    *(
                        f"{number(r.by_project[project].mean_gpus)} "
                        f"({number(r.by_project[project].gpu_hours, 0)} GPU-h)"
                        for r in results
                    ),
                ]
                for project in first.projects
            ],
        ),
        "",
        "## Plots",
        "",
        *(f"![{name.replace('_', ' ')}]({file})" for name, file in PLOTS.items()),
        "",
    ]
    return "\n".join(lines)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


# -- plots -------------------------------------------------------------------------------


def plot_allocation(results: Sequence[SimResult], path: Path) -> None:
    figure = _figure(figsize=(10, 6), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True)
    for result in results:
        hours = result.series.times / HOUR
        (line,) = top.plot(hours, result.series.held.sum(axis=1) / result.gpus, label=result.policy)
        if result.utilisation is not None:
            top.plot(
                hours,
                result.series.busy.sum(axis=1) / result.gpus,
                linestyle="--",
                color=line.get_color(),
                label=f"{result.policy} (utilised)",
            )
        bottom.plot(hours, result.series.pending.sum(axis=1), label=result.policy)
    top.set_ylabel("share of GPUs allocated")
    top.set_ylim(0, 1.05)
    top.legend(loc="lower right", fontsize="small")
    bottom.set_ylabel("GPUs asked for by pending work")
    bottom.set_xlabel("hours")
    figure.suptitle("Allocation, utilisation and pending demand over time")
    figure.savefig(path, dpi=110)


def plot_queueing_delay(results: Sequence[SimResult], path: Path) -> None:
    projects = results[0].projects
    figure = _figure(figsize=(max(6, 1.1 * len(projects) + 3), 6), layout="constrained")
    axes = figure.subplots(2, 1, sharex=True)
    width = 0.8 / len(results)
    positions = np.arange(len(projects))
    for panel, label in zip(axes, ("mean", "p95"), strict=True):
        for at, result in enumerate(results):
            delays = [result.by_project[name].queueing_delay for name in projects]
            values = [((d.mean if label == "mean" else d.p95) or 0.0) / HOUR for d in delays]
            panel.bar(positions + at * width, values, width, label=result.policy)
        panel.set_ylabel(f"{label} queueing delay (h)")
    axes[0].legend(fontsize="small")
    axes[1].set_xticks(positions + width * (len(results) - 1) / 2, projects, rotation=45)
    figure.suptitle("Queueing delay by project")
    figure.savefig(path, dpi=110)


def plot_usage_vs_quota(results: Sequence[SimResult], path: Path) -> None:
    projects = results[0].projects
    figure = _figure(figsize=(max(6, 1.1 * len(projects) + 3), 4.5), layout="constrained")
    axes = figure.subplots()
    width = 0.8 / len(results)
    positions = np.arange(len(projects))
    for at, result in enumerate(results):
        values = [result.by_project[name].mean_gpus for name in projects]
        axes.bar(positions + at * width, values, width, label=result.policy)
    quotas = [results[0].by_project[name].quota for name in projects]
    axes.hlines(
        quotas, positions - width / 2, positions + 0.8 - width / 2, colors="black", label="quota"
    )
    axes.set_xticks(positions + width * (len(results) - 1) / 2, projects, rotation=45)
    axes.set_ylabel("mean GPUs held")
    axes.legend(fontsize="small")
    figure.suptitle("Usage against quota, by project")
    figure.savefig(path, dpi=110)


def write_report(
    directory: Path, inputs: Inputs, results: Sequence[SimResult]
) -> Mapping[str, Path]:
    """Write report.json, report.md and the plots into `directory`; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": directory / "report.json",
        "markdown": directory / "report.md",
        **{name: directory / file for name, file in PLOTS.items()},
    }
    paths["json"].write_text(json.dumps(report_json(inputs, results), indent=2) + "\n")
    paths["markdown"].write_text(report_markdown(inputs, results))
    plot_allocation(results, paths["allocation"])
    plot_queueing_delay(results, paths["queueing_delay"])
    plot_usage_vs_quota(results, paths["usage_vs_quota"])
    return paths


def _figure(**options: Any) -> Any:
    """A matplotlib figure; matplotlib is imported only when a report draws plots, so that
    every other `corral` command starts without it."""
    from matplotlib.figure import Figure

    return Figure(**options)
