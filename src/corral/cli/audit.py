"""`corral audit`: the audit log of writes and sessions (exec, shell, port-forward; admins
only), as a table or as JSON lines."""

from __future__ import annotations

import shlex
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
from corral.sdk.types import AuditOut

_AGO = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The status of a session that opened (the WebSocket's 101 Switching Protocols).
OPENED = 101


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
    """Who wrote what, when, from where, and how it was answered; and who entered which
    workload's task, with what command, and how it ended (admins only)."""
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
    for column in ("time (UTC)", "user", "action", "path", "address", "status", "session"):
        table.add_column(column)
    for record in records:
        table.add_row(
            when(record["at"]),
            record["user"] or "-",
            f"{record['method']} {record['route']}",
            record["path"],
            record["address"] or "-",
            str(record["status"]),
            session_summary(record),
        )
    out_console().print(table)


def session_summary(record: AuditOut) -> str:
    """What a session's record says beyond a write's: its task and command, then how long
    it lasted and how it ended ("open" while it runs); "" for a write."""
    task, ended = record.get("task"), record.get("ended_at")
    if record.get("workload") is None or task is None:
        return ""
    command = shlex.join(record.get("command") or [])
    what = f"task {task}" + (f": {command}" if command else "")
    if record["status"] != OPENED:
        return what
    if ended is None:
        return f"{what}; open"
    code = record.get("exit_code")
    end = f"exit {code}" if code is not None else "no exit code"
    return f"{what}; {ended - record['at']:.1f} s, {end}"
