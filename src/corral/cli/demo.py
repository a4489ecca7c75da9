"""`corral demo`: the GPU pooling story, live, on 8 virtual GPUs."""

import typer

from corral.cli.common import reported_errors


def demo_command(ctx: typer.Context) -> None:
    """Show borrowing, reclaim, checkpoint and resume on 8 virtual GPUs (under 2 minutes)."""
    from corral.server.demo import run_demo

    with reported_errors(ctx):
        code = run_demo()
    raise typer.Exit(code)
