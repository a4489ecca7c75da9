"""`--workspace-domain`, shared by `corral up` and `corral server`: one origin per
workspace (see corral.workspaces.origins)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from corral.cli.common import InvalidInput

ENVIRONMENT = "CORRAL_WORKSPACE_DOMAIN"

WorkspaceDomain = Annotated[
    str | None,
    typer.Option(
        "--workspace-domain",
        envvar=ENVIRONMENT,
        metavar="DOMAIN",
        help="Serve workspace NAME at its own origin, NAME.DOMAIN (a wildcard DNS name "
        "leading to this server), so that one workspace's pages cannot script another's. "
        "Without it they share the server's origin.",
        show_default=False,
    ),
]


def use_workspace_domain(value: str | None) -> None:
    """Check the domain and hand it to the server (which reads it from the environment,
    as it reads its rate limits); InvalidInput for a name that is not a domain."""
    from corral.workspaces.origins import check_domain

    if not value:
        os.environ.pop(ENVIRONMENT, None)
        return
    try:
        os.environ[ENVIRONMENT] = check_domain(value)
    except ValueError as error:
        raise InvalidInput(f"--workspace-domain: {error}") from None
