"""`corral user create|list|token|delete|add-project|remove-project`: accounts, the projects
they belong to, and their tokens, for admins.

A user's role is global: an admin does everything, a viewer reads every project, a member
reads and submits in the projects they belong to, as a `member` (manages their own
workloads) or a `project-admin` (manages every workload of the project).

A token is printed alone on stdout, and only once (the server keeps its digest), so that
`TOKEN=$(corral user create ...)` works; the sentence around it goes to stderr.
"""

from typing import Annotated, Literal

import typer
from rich.table import Table

from corral.cli.common import (
    OutputFormat,
    out_console,
    printed_as_data,
    reported_errors,
)
from corral.cli.config import connect, describe_user
from corral.sdk.types import MembershipOut, Role

user_app = typer.Typer(
    help="Users, their projects and their tokens (admins only).", no_args_is_help=True
)
ProjectRole = Literal["member", "project-admin"]

Name = Annotated[str, typer.Argument(metavar="NAME", help="The user's name.", show_default=False)]


@user_app.command("create")
def create_command(
    ctx: typer.Context,
    name: Name,
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            "-p",
            help="A member's first project (add more with add-project).",
            show_default=False,
        ),
    ] = None,
    role: Annotated[
        Role,
        typer.Option(
            "--role",
            help="member: reads and submits in their projects; viewer: reads every "
            "project; admin: everything.",
        ),
    ] = "member",
    unix_user: Annotated[
        str | None,
        typer.Option(
            "--unix-user",
            help="The Unix account their tasks run as when corral runs as root "
            "(default: the account named like the user; never root).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Create a user and print their first token."""
    with reported_errors(ctx), connect() as client:
        issued = client.create_user(name, role, project, unix_user)
    user = describe_user(issued["user"], role, project)
    typer.echo(f"Created {user}. Their token, shown only this once:", err=True)
    typer.echo(issued["token"])


@user_app.command("token")
def token_command(ctx: typer.Context, name: Name) -> None:
    """Issue another token for a user; the ones issued before stay valid."""
    with reported_errors(ctx), connect() as client:
        issued = client.create_token(name)
    typer.echo(f"A new token for {issued['user']}, shown only this once:", err=True)
    typer.echo(issued["token"])


Project = Annotated[str, typer.Argument(metavar="PROJECT", help="The project.", show_default=False)]


@user_app.command("add-project")
def add_project_command(
    ctx: typer.Context,
    name: Name,
    project: Project,
    role: Annotated[
        ProjectRole,
        typer.Option(
            "--role",
            help="member: manages their own workloads there; project-admin: every "
            "workload of the project.",
        ),
    ] = "member",
) -> None:
    """Make a member belong to another project (or change their role in one)."""
    with reported_errors(ctx), connect() as client:
        user = client.set_membership(name, project, role)
    typer.echo(f"{user['name']} is now in {_projects(user['projects'])}.", err=True)


@user_app.command("remove-project")
def remove_project_command(ctx: typer.Context, name: Name, project: Project) -> None:
    """Take a member out of a project; their workloads there stay."""
    with reported_errors(ctx), connect() as client:
        client.remove_membership(name, project)
    typer.echo(f"{name} is no longer in {project}.", err=True)


def _projects(memberships: list[MembershipOut]) -> str:
    """`team-a (member), team-b (project-admin)`, or `-`."""
    return ", ".join(f"{m['project']} ({m['role']})" for m in memberships) or "-"


@user_app.command("delete")
def delete_command(ctx: typer.Context, name: Name) -> None:
    """Delete a user; their tokens stop working at once. Their workloads stay."""
    with reported_errors(ctx), connect() as client:
        client.delete_user(name)
    typer.echo(f"Deleted {name}; their tokens no longer work.")


@user_app.command("list")
def list_command(
    ctx: typer.Context,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API's JSON.")] = False,
    output: OutputFormat = "table",
) -> None:
    """Every user, with their role and projects (with their role in each)."""
    with reported_errors(ctx), connect() as client:
        users = client.list_users()
        if printed_as_data(users, output, json_output):
            return
    table = Table()
    for column in ("user", "role", "projects", "unix user"):
        table.add_column(column)
    for user in users:
        table.add_row(
            user["name"], user["role"], _projects(user["projects"]), user["unix_user"] or "-"
        )
    out_console().print(table)
