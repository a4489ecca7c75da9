"""`corral audit`: the audit log of writes (admins only), as a table or as JSON lines."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from corral.cli.common import (
    InvalidInput,
    OutputFormat,
    out_console,
    printed_as_data,
    reported_errors,
)
from corral.cli.config import connect
from corral.cli.tokens import when

_AGO = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def point_in_time(flag: str, text: str, now: float) -> float:
    """Seconds since the epoch from "90m" / "2d" (that long ago), an ISO date or time
    ("2026-11-23", "2026-11-23T12:00:00+00:00"), or seconds since the epoch."""
    text = text.strip()
    if text[:-1].replace(".", "", 1).isdigit() and text[-1:] in _AGO:
        return now - float(text[:-1]) * _AGO[text[-1]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise InvalidInput(
            f"{flag}: {text!r} is not a time (for example 2h, 2d, 2026-11-23T12:00)"
        ) from None


def audit_command(
    ctx: typer.Context,
    user: Annotated[
        str | None, typer.Option("--user", help="Only this user's writes.", show_default=False)
    ] = None,
    action: Annotated[
        str | None,
        typer.Option(
            "--action",
            help='Part of "METHOD route", e.g. "POST /api/v1/workloads".',
            show_default=False,
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="From: 2h, 7d (ago) or an ISO time.", show_default=False),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Before: 2h, 7d (ago) or an ISO time.", show_default=False),
    ] = None,
    outcome: Annotated[
        str | None,
        typer.Option("--outcome", help='A status ("403") or a class ("4xx").', show_default=False),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many, the newest.")] = 1000,
    json_output: Annotated[
        bool, typer.Option("--json", help="JSON lines, one record per line.")
    ] = False,
    output: OutputFormat = "table",
) -> None:
    """Who wrote what, when, from where, and how it was answered (admins only)."""
    with reported_errors(ctx):
        now = time.time()
        filters = {
            "user": user,
            "action": action,
            "since": point_in_time("--since", since, now) if since else None,
            "until": point_in_time("--until", until, now) if until else None,
            "outcome": outcome,
            "limit": limit,
        }
        with connect() as client:
            if json_output:
                typer.echo(client.audit_export(**filters), nl=False)
                return
            records = client.audit(**filters)
        if printed_as_data(records, output):
            return
    table = Table()
    for column in ("time (UTC)", "user", "action", "path", "address", "status"):
        table.add_column(column)
    for record in records:
        table.add_row(
            when(record["at"]),
            record["user"] or "-",
            f"{record['method']} {record['route']}",
            record["path"],
            record["address"] or "-",
            str(record["status"]),
        )
    out_console().print(table)
