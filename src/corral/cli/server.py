"""`corral server`: the control plane on this machine."""

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.common import CliError, check_server_environment, reported_errors
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


def server_command(
    ctx: typer.Context,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Where the store and the admin token live.",
            show_default="~/.local/share/corral",
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option("--db", help="A PostgreSQL URL (postgresql://...) instead of SQLite."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8700,
    secret_key_file: Annotated[
        Path | None,
        typer.Option(
            "--secret-key-file",
            help="The key that encrypts project secrets (also CORRAL_SECRET_KEY_FILE, or "
            "the key itself in CORRAL_SECRET_KEY). Servers sharing a PostgreSQL store "
            "must share it.",
            show_default="DATA_DIR/secret-key, created on the first start",
        ),
    ] = None,
    ray: RayAddress = None,
    checkpoint_root: CheckpointRoot = None,
    loss_timeout: LossTimeout = 10.0,
    fence_timeout: FenceTimeout = 4.0,
    server_absence: ServerAbsence = 600.0,
    agent_dir: AgentDir = "~/.local/share/corral-agent",
    workspace_domain: WorkspaceDomain = None,
    admin_unix_user: Annotated[
        str | None,
        typer.Option(
            "--admin-unix-user",
            help="The Unix account the admin's tasks run as on agents that run as root "
            "(without it they are refused there).",
            show_default=False,
        ),
    ] = None,
    log_cap: LogCap = "1GiB",
    task_pids: TaskPids = 4096,
    no_task_limits: NoTaskLimits = False,
    index_url: NodeIndexUrl = None,
    find_links: NodeFindLinks = None,
) -> None:
    """Run the server: the REST API and the scheduler loop; with --ray, also an agent on
    every node of a Ray cluster (no agent otherwise)."""
    from corral.agent.planted import Planted
    from corral.server.main import DEFAULT_DATA_DIR, PortBusy, serve

    with reported_errors(ctx):
        if checkpoint_root is not None and ray is None:
            raise CliError("--checkpoint-root needs --ray: corral server alone runs no task")
        use_workspace_domain(workspace_domain)
        check_server_environment()
        walls = wall_options(log_cap, task_pids, no_task_limits)
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
            serve(
                data_dir or DEFAULT_DATA_DIR,
                db,
                host,
                port,
                options,
                admin_unix_user,
                secret_key_file,
            )
        except (PortBusy, Planted) as error:
            raise CliError(str(error)) from None
