"""`corral token list|create|revoke`: API tokens with their names, expiry and last use.

Token values are printed only when made, alone on stdout (`TOKEN=$(corral token create
...)`); listing shows their ids, never their values.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from corral.cli.common import (
    OutputFormat,
    out_console,
    printed_as_data,
    reported_errors,
)
from corral.cli.config import connect

token_app = typer.Typer(help="API tokens: list, create, revoke.", no_args_is_help=True)


def when(seconds: float | None) -> str:
    """A time as UTC for a table, or "-"."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


@token_app.command("list")
def list_command(
    ctx: typer.Context,
    user: Annotated[
        str | None, typer.Option("--user", help="Only this user's tokens.", show_default=False)
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API's JSON.")] = False,
    output: OutputFormat = "table",
) -> None:
    """Tokens with their ids, names, expiry and last use (an admin sees everyone's)."""
    with reported_errors(ctx), connect() as client:
        tokens = client.list_tokens(user)
        if printed_as_data(tokens, output, json_output):
            return
    table = Table()
    for column in ("id", "user", "name", "created", "expires", "last used", "state"):
        table.add_column(column)
    now = time.time()
    for token in tokens:
        if token["revoked_at"] is not None:
            state = "revoked"
        elif token["expires_at"] is not None and token["expires_at"] <= now:
            state = "expired"
        else:
            state = "active"
        table.add_row(
            str(token["id"]),
            token["user"],
            token["name"] or "-",
            when(token["created_at"]),
            when(token["expires_at"]),
            when(token["last_used_at"]),
            state,
        )
    out_console().print(table)


@token_app.command("create")
def create_command(
    ctx: typer.Context,
    user: Annotated[str, typer.Argument(metavar="USER", help="Whose token (admins only).")],
    name: Annotated[
        str | None, typer.Option("--name", help="What the token is for.", show_default=False)
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(
            "--expires", help="Lifetime: 90m, 12h, 30d (at most a year).", show_default=False
        ),
    ] = None,
) -> None:
    """Issue a token for a user and print it, only this once."""
    with reported_errors(ctx), connect() as client:
        issued = client.create_token(user, name, expires)
    until = f", expiring {when(issued['expires_at'])} UTC" if issued["expires_at"] else ""
    typer.echo(f"Token {issued['id']} for {issued['user']}{until}, shown only this once:", err=True)
    typer.echo(issued["token"])


@token_app.command("revoke")
def revoke_command(
    ctx: typer.Context,
    token_id: Annotated[int, typer.Argument(metavar="ID", help="The id from `token list`.")],
) -> None:
    """Revoke a token: it stops working at once."""
    with reported_errors(ctx), connect() as client:
        client.revoke_token(token_id)
    typer.echo(f"Revoked token {token_id}.")
