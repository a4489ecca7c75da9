"""`corral user create|list|token|delete`: accounts and their tokens, for admins.

A token is printed alone on stdout, and only once (the server keeps its digest), so that
`TOKEN=$(corral user create ...)` works; the sentence around it goes to stderr.
"""

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from corral.cli.common import print_json, reported_errors
from corral.cli.config import connect, describe_user
from corral.sdk.types import Role

user_app = typer.Typer(help="Users and their tokens (admins only).", no_args_is_help=True)

Name = Annotated[str, typer.Argument(metavar="NAME", help="The user's name.", show_default=False)]


@user_app.command("create")
def create_command(
    ctx: typer.Context,
    name: Name,
    project: Annotated[
        str | None,
        typer.Option("--project", "-p", help="The project a member works in.", show_default=False),
    ] = None,
    role: Annotated[
        Role,
        typer.Option(
            "--role", help="member: submits to their project; viewer: reads; admin: everything."
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
) -> None:
    """Every user, with their role and project."""
    with reported_errors(ctx), connect() as client:
        users = client.list_users()
    if json_output:
        print_json(users)
        return
    table = Table()
    for column in ("user", "role", "project", "unix user"):
        table.add_column(column)
    for user in users:
        table.add_row(user["name"], user["role"], user["project"] or "-", user["unix_user"] or "-")
    Console().print(table)
