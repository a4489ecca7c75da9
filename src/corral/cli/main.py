"""The `corral` application: global options, and one module per command or command group.

A new command is a function in its own module, registered here with `app.command`, or a
Typer sub-app registered with `app.add_typer`.
"""

from typing import Annotated

import typer

from corral.cli.audit import audit_command
from corral.cli.common import CliState
from corral.cli.config import login_command
from corral.cli.demo import demo_command
from corral.cli.lifecycle import cancel_command, history_command, update_command
from corral.cli.logs import logs_command
from corral.cli.nodes import node_app, nodes_command
from corral.cli.plan import plan_command
from corral.cli.project import project_app, queues_command
from corral.cli.remote import exec_command, port_forward_command, shell_command
from corral.cli.report import report_app
from corral.cli.secrets import secret_app
from corral.cli.server import server_command
from corral.cli.simulate import simulate
from corral.cli.submit import SubmitCommand, apply_command, submit_command
from corral.cli.tokens import token_app
from corral.cli.up import up_command
from corral.cli.users import user_app
from corral.cli.workloads import (
    delete_command,
    describe_command,
    list_command,
    resume_command,
    suspend_command,
    why_command,
)
from corral.cli.workspace import open_command, workspace_app

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
app.command("login")(login_command)
app.add_typer(user_app, name="user")
app.add_typer(secret_app, name="secret")
app.add_typer(token_app, name="token")
app.command("audit")(audit_command)
app.add_typer(project_app, name="project")
app.command("queues")(queues_command)
app.command("submit", cls=SubmitCommand)(submit_command)
app.command("apply")(apply_command)
app.command("list")(list_command)
app.command("describe")(describe_command)
app.command("cancel")(cancel_command)
app.command("delete")(delete_command)
app.command("update")(update_command)
app.command("history")(history_command)
app.command("suspend")(suspend_command)
app.command("resume")(resume_command)
app.command("why")(why_command)
app.command("nodes")(nodes_command)
app.add_typer(node_app, name="node")
app.add_typer(report_app, name="report")
app.command("up")(up_command)
app.command("demo")(demo_command)
app.command("logs")(logs_command)
app.command("simulate")(simulate)
app.add_typer(workspace_app, name="workspace")
app.command("open")(open_command)
app.command("exec")(exec_command)
app.command("shell")(shell_command)
app.command("port-forward")(port_forward_command)
