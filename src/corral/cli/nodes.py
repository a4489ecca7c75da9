"""`corral nodes` and `corral node register|cordon|uncordon|remove`: the machines."""

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from corral.cli.common import (
    OutputFormat,
    out_console,
    parse_memory_option,
    parse_number,
    parse_pairs,
    printed_as_data,
    reported_errors,
)
from corral.cli.config import connect
from corral.model import format_gpus, format_memory
from corral.sdk.types import NodeOut

node_app = typer.Typer(
    help="Register nodes by hand and take them in and out of service (admins only).",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(metavar="NAME", help="The node's name.", show_default=False)]


def nodes_command(
    ctx: typer.Context,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API's JSON.")] = False,
    output: OutputFormat = "table",
) -> None:
    """Nodes, their devices, and what runs on each device."""
    with reported_errors(ctx), connect() as client:
        nodes = client.list_nodes()
        if printed_as_data(nodes, output, json_output):
            return
    if not nodes:
        typer.echo("No nodes registered.")
        return
    table = Table()
    for column in ("node", "state", "gpus used", "gpu model", "cpus", "memory", "labels"):
        table.add_column(column)
    table.add_column("devices: work")
    table.add_column("pool")
    wide = output == "wide"
    if wide:
        for column in ("virtual", "registered", "last heartbeat"):
            table.add_column(column)
    for node in nodes:
        table.add_row(
            node["name"],
            _state(node),
            f"{format_gpus(node['allocated_gpu'])}/{node['gpus']}",
            f"{node['gpu_model']} ({format_memory(node['gpu_memory'])})" if node["gpus"] else "-",
            f"{node['cpu']:g}",
            format_memory(node["memory"]),
            "\n".join(f"{key}={value}" for key, value in node["labels"].items()),
            _devices(node),
            node["pool"],
            *(wide_node_cells(node) if wide else ()),
        )
    out_console().print(table)


def wide_node_cells(node: NodeOut) -> tuple[str, ...]:
    """The cells `corral nodes -o wide` adds."""
    heartbeat = node["heartbeat_at"]
    return (
        "yes" if node["virtual"] else "no",
        _when(node["registered_at"]),
        "-" if heartbeat is None else _when(heartbeat),
    )


def _when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _state(node: NodeOut) -> Text:
    if not node["schedulable"]:
        return Text(f"{node['state']}, cordoned", style="yellow")
    return Text(node["state"], style="green" if node["state"] == "ready" else "red")


def _devices(node: NodeOut) -> Text:
    """One line per device: its index and the tasks on it ("0: train-a/1 (0.5)")."""
    lines = []
    for device in node["devices"]:
        work = []
        for task in node["tasks"]:
            if device["index"] in task["devices"]:
                share = task["gpu"] / len(task["devices"])
                part = f" ({format_gpus(share)})" if share < 1 else ""
                work.append(f"{task['workload']}/{task['task']}{part}")
        lines.append(
            Text(f"{device['index']}: ").append(", ".join(work) or "free", "" if work else "dim")
        )
    return Text("\n").join(lines) if lines else Text("-")


@node_app.command("register")
def register_command(
    ctx: typer.Context,
    name: Name,
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="How many GPUs it has.")] = 0,
    gpu_model: Annotated[
        str, typer.Option("--gpu-model", help="The GPUs' model, e.g. H100.")
    ] = "generic",
    gpu_memory: Annotated[
        str, typer.Option("--gpu-memory", metavar="MEMORY", help="Memory of each GPU.")
    ] = "80GiB",
    cpu: Annotated[str, typer.Option("--cpu", metavar="CPUS", help="Its CPUs.")] = "64",
    memory: Annotated[
        str, typer.Option("--memory", metavar="MEMORY", help="Its memory.")
    ] = "512GiB",
    label: Annotated[
        list[str] | None,
        typer.Option("--label", metavar="KEY=VALUE", help="A label, e.g. rack=r1 (repeatable)."),
    ] = None,
) -> None:
    """Register a node with virtual devices, for a node without an agent of its own."""
    with reported_errors(ctx):
        parse_memory_option("--gpu-memory", gpu_memory)
        parse_memory_option("--memory", memory)
        body: dict[str, Any] = {
            "name": name,
            "gpus": gpus,
            "gpu_model": gpu_model,
            "gpu_memory": gpu_memory,
            "cpu": parse_number("--cpu", cpu, "a number of CPUs"),
            "memory": memory,
            "labels": dict(parse_pairs("--label", label or [])),
        }
        with connect() as client:
            node = client.register_node(body)
    typer.echo(
        f"Registered {node['name']}: {node['gpus']} × {node['gpu_model']} "
        f"({format_memory(node['gpu_memory'])})."
    )


@node_app.command("cordon")
def cordon_command(ctx: typer.Context, name: Name) -> None:
    """Place no new work on a node; what runs there keeps running."""
    with reported_errors(ctx), connect() as client:
        client.cordon(name)
    typer.echo(f"Cordoned {name}: no new work will be placed on it.")


@node_app.command("uncordon")
def uncordon_command(ctx: typer.Context, name: Name) -> None:
    """Let the scheduler place work on a node again."""
    with reported_errors(ctx), connect() as client:
        client.uncordon(name)
    typer.echo(f"Uncordoned {name}.")


@node_app.command("remove")
def remove_command(ctx: typer.Context, name: Name) -> None:
    """Remove a node; work bound to it goes back to its queue."""
    with reported_errors(ctx), connect() as client:
        client.remove_node(name)
    typer.echo(f"Removed {name}.")
