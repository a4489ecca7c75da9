"""`corral secret set|list|delete`: a project's secrets, for its members and admins.

A value is read from stdin (a pipe, or typed without echo) or from `--from-file`, never
from the command line, where `ps` and the shell's history would keep it. It is stored
encrypted and only ever reaches the environment of the project's tasks that name it
(`corral submit --secret NAME`, or `secrets:` in YAML); no command prints it back.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from corral.cli.common import (
    InvalidInput,
    OutputFormat,
    format_when,
    out_console,
    printed_as_data,
    reported_errors,
)
from corral.cli.config import connect

secret_app = typer.Typer(
    help="A project's secrets: set from stdin or a file, listed by name only.",
    no_args_is_help=True,
)

Name = Annotated[
    str,
    typer.Argument(
        metavar="NAME",
        help="The secret's name, also the variable a task gets it in by default.",
        show_default=False,
    ),
]
Project = Annotated[
    str,
    typer.Option("--project", "-p", help="The project the secret belongs to.", show_default=False),
]


def _value(from_file: Path | None) -> str:
    """The value from the file, else stdin: piped as is, typed without echo."""
    if from_file is not None:
        return from_file.read_text().removesuffix("\n")
    if sys.stdin.isatty():
        return str(typer.prompt("Value", hide_input=True))
    return sys.stdin.read().removesuffix("\n")


@secret_app.command("set")
def set_command(
    ctx: typer.Context,
    name: Name,
    project: Project,
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from-file",
            metavar="FILE",
            help="Read the value from FILE (one final newline dropped) instead of stdin.",
            exists=True,
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Set (or replace) a secret of the project."""
    with reported_errors(ctx):
        value = _value(from_file)
        if not value:
            raise InvalidInput("the secret is empty")
        with connect() as client:
            client.set_secret(project, name, value)
    typer.echo(f"Secret {name} of {project} set.", err=True)


@secret_app.command("list")
def list_command(
    ctx: typer.Context,
    project: Project,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API's JSON.")] = False,
    output: OutputFormat = "table",
) -> None:
    """The project's secrets: names and when each was set, never values."""
    with reported_errors(ctx), connect() as client:
        found = client.list_secrets(project)
        if printed_as_data(found, output, json_output):
            return
    table = Table()
    for column in ("secret", "set"):
        table.add_column(column)
    for secret in found:
        table.add_row(secret["name"], format_when(secret["updated_at"]))
    out_console().print(table)


@secret_app.command("delete")
def delete_command(ctx: typer.Context, name: Name, project: Project) -> None:
    """Delete a secret of the project; workloads that name it start without it."""
    with reported_errors(ctx), connect() as client:
        client.delete_secret(project, name)
    typer.echo(f"Secret {name} of {project} deleted.", err=True)
