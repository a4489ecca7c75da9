"""`corral demo`: the GPU pooling story, live, on 8 virtual GPUs."""

import typer

from corral.cli.common import check_server_environment, reported_errors


def demo_command(ctx: typer.Context) -> None:
    """Show borrowing, reclaim, checkpoint and resume on 8 virtual GPUs (under 2 minutes)."""
    from corral.server.demo import run_demo

    with reported_errors(ctx):
        check_server_environment()
        code = run_demo()
    raise typer.Exit(code)
