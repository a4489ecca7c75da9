"""The `--ray` options that `corral up` and `corral server` share."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from corral.cli.common import CliError

if TYPE_CHECKING:
    from corral.agent.prepare import NodeIndex
    from corral.agent.walls import WallOptions
    from corral.server.main import RayOptions

RAY_HINT = "pip install 'corral[ray]'"

RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        help="Run an agent on every node of the Ray cluster at ADDRESS (HOST:PORT, or auto).",
    ),
]
CheckpointRoot = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint-root",
        help="Storage every node sees (NFS...) for each workload's own directory, its "
        "checkpoints among them, so that a workload finds them on any node; without --ray, "
        "the same as --workloads-dir.",
    ),
]
LossTimeout = Annotated[
    float,
    typer.Option(
        "--loss-timeout", min=7.0, help="With --ray: seconds until a silent node is lost."
    ),
]
FenceTimeout = Annotated[
    float,
    typer.Option(
        "--fence-timeout",
        min=1.0,
        help="With --ray: seconds until the tasks of a node cut off from the cluster stop.",
    ),
]
ServerAbsence = Annotated[
    float,
    typer.Option(
        "--server-absence",
        min=60.0,
        help="With --ray: seconds that tasks keep running without a word from the server "
        "while their node is still part of the Ray cluster (a server restarting or down).",
    ),
]

AgentDir = Annotated[
    str,
    typer.Option(
        "--agent-dir", help="With --ray: the agents' directory on their nodes (~ is theirs)."
    ),
]


def ray_options(
    address: str | None,
    checkpoint_root: Path | None,
    loss_timeout: float,
    fence_timeout: float,
    agent_dir: str,
    server_absence: float,
    walls: WallOptions | None = None,
    index: NodeIndex | None = None,
) -> RayOptions | None:
    """The server's RayOptions, or None without --ray; Ray must be installed for --ray."""
    from corral.server.main import RayOptions

    if address is None:
        return None
    if importlib.util.find_spec("ray") is None:
        raise CliError(f"--ray needs Ray, which is not installed: {RAY_HINT}")
    return RayOptions(
        address,
        checkpoint_root,
        loss_timeout,
        fence_timeout,
        agent_dir,
        server_absence,
        walls,
        index,
    )
