"""`corral up`: the server and an agent for this machine, in one command."""

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.common import EXIT_INVALID, CliError, check_server_environment, reported_errors
from corral.cli.ray_options import (
    AgentDir,
    CheckpointRoot,
    FenceTimeout,
    LossTimeout,
    RayAddress,
    ServerAbsence,
    ray_options,
)
from corral.cli.task_walls import (
    LogCap,
    NodeFindLinks,
    NodeIndexUrl,
    NoTaskLimits,
    TaskPids,
    node_index,
    wall_options,
)
from corral.cli.workspace_domain import WorkspaceDomain, use_workspace_domain


def up_command(
    ctx: typer.Context,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Where the store, logs and the admin token live (made 0700).",
            show_default="~/.local/share/corral",
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option("--db", help="A PostgreSQL URL (postgresql://...) instead of SQLite."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8700,
    virtual_gpus: Annotated[
        int | None,
        typer.Option(
            "--virtual-gpus",
            min=0,
            max=1024,
            help="Use N virtual GPUs instead of the real ones (4 when none are found).",
        ),
    ] = None,
    virtual_gpu_model: Annotated[
        str, typer.Option("--virtual-gpu-model", help="Model name of the virtual GPUs.")
    ] = "virtual",
    virtual_gpu_memory: Annotated[
        str, typer.Option("--virtual-gpu-memory", help="Memory of each virtual GPU.")
    ] = "80GiB",
    label: Annotated[
        list[str] | None, typer.Option("--label", help="A node label k=v (repeatable).")
    ] = None,
    workloads_dir: Annotated[
        Path | None,
        typer.Option(
            "--workloads-dir",
            help="Where each workload's own directory (checkpoints, telemetry) lives; "
            "outside the data directory, and passable by every account when run as root.",
            show_default="DATA_DIR-workloads",
        ),
    ] = None,
    admin_unix_user: Annotated[
        str | None,
        typer.Option(
            "--admin-unix-user",
            help="The Unix account the admin's tasks run as when corral runs as root "
            "(without it they are refused there).",
            show_default=False,
        ),
    ] = None,
    ray: RayAddress = None,
    checkpoint_root: CheckpointRoot = None,
    loss_timeout: LossTimeout = 10.0,
    fence_timeout: FenceTimeout = 4.0,
    server_absence: ServerAbsence = 600.0,
    agent_dir: AgentDir = "~/.local/share/corral-agent",
    workspace_domain: WorkspaceDomain = None,
    log_cap: LogCap = "1GiB",
    task_pids: TaskPids = 4096,
    no_task_limits: NoTaskLimits = False,
    index_url: NodeIndexUrl = None,
    find_links: NodeFindLinks = None,
) -> None:
    """Start corral on this machine: the server and an agent for its GPUs, real or virtual.
    With --ray, the server and an agent on every node of a Ray cluster."""
    from corral.agent.planted import Planted
    from corral.model import parse_memory
    from corral.server.main import DEFAULT_DATA_DIR, PortBusy, up

    labels = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            typer.secho(f"--label: {item!r} is not KEY=VALUE", fg="red", err=True)
            raise typer.Exit(EXIT_INVALID)
        labels[key] = value
    try:
        memory = parse_memory(virtual_gpu_memory)
    except ValueError as error:
        typer.secho(f"--virtual-gpu-memory: {error}", fg="red", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    walls = wall_options(log_cap, task_pids, no_task_limits)
    if ray is not None and virtual_gpus is not None:
        typer.secho(
            "--virtual-gpus does not apply with --ray: give Ray nodes a corral_virtual_gpus"
            " resource instead",
            fg="red",
            err=True,
        )
        raise typer.Exit(EXIT_INVALID)
    with reported_errors(ctx):
        use_workspace_domain(workspace_domain)
        check_server_environment()
        index = node_index(index_url, find_links)
        options = ray_options(
            ray,
            checkpoint_root,
            loss_timeout,
            fence_timeout,
            agent_dir,
            server_absence,
            walls,
            index,
        )
        try:
            if ray is None:
                own = workloads_dir or checkpoint_root
                refuse_planted_workloads_dir(own, data_dir or DEFAULT_DATA_DIR)
            up(
                data_dir or DEFAULT_DATA_DIR,
                db,
                host,
                port,
                virtual_gpus,
                virtual_gpu_model,
                memory,
                labels,
                workloads_dir or checkpoint_root,
                admin_unix_user,
                options,
                walls,
                index,
            )
        except (PortBusy, Planted) as error:
            raise CliError(str(error)) from None


def refuse_planted_workloads_dir(workloads_dir: Path | None, data_dir: Path) -> None:
    """Refuse a workloads directory another account could have planted before anything is
    written (the data directory is checked as it is opened): the agent sets its mode, and
    would set that of whatever a planted symlink points at."""
    from corral.agent.identity import default_workloads_dir
    from corral.agent.planted import refuse_planted

    refuse_planted(workloads_dir or default_workloads_dir(data_dir), "--workloads-dir")
