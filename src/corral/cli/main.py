"""The `corral` application: global options, and one module per command or command group.

A new command is a function in its own module, registered here with `app.command`, or a
Typer sub-app registered with `app.add_typer`.
"""

from typing import Annotated

import typer

from corral.cli.common import CliState
from corral.cli.demo import demo_command
from corral.cli.plan import plan_command
from corral.cli.server import server_command
from corral.cli.up import up_command

app = typer.Typer(
    name="corral",
    help="Pool GPUs and share them by policy: quotas, fair share, reclaim, preemption, gangs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def main(
    ctx: typer.Context,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the full traceback when something fails.")
    ] = False,
) -> None:
    """corral: a GPU cluster scheduler."""
    ctx.obj = CliState(debug=debug)


app.command("plan")(plan_command)
app.command("server")(server_command)
app.command("up")(up_command)
app.command("demo")(demo_command)
