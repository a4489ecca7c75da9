"""The audit log: one row per write request the API answered and per session that entered
(or tried to enter) a workload's task, and its queries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from corral.store.bulk import Rows
from corral.store.schema import AuditRow


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """A write request: who (None for no valid token), when, what (method, route template
    and path), from which address, and the HTTP status it was answered with. A session
    (method EXEC or FORWARD; status 101 once it opened) has the workload and task it
    entered, its command (exec), and once over when it ended and the command's exit code
    (None when it ended otherwise: its client left, its user lost access)."""

    at: float
    user: str | None
    method: str
    route: str
    path: str
    address: str | None
    status: int
    workload: str | None = None
    task: int | None = None
    command: tuple[str, ...] | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    id: int | None = None


# A new record's row (its id is the database's).
_AUDIT = Rows(
    cast(Table, AuditRow.__table__), ("at", "user", "method", "route", "path", "address", "status")
)


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Filters of `list_audit`; each one left None does not filter. `action` matches
    "METHOD route" by substring ("POST /api/v1/workloads", "suspend"); `outcome` is a
    status ("403") or a class ("2xx", "4xx")."""

    user: str | None = None
    action: str | None = None
    since: float | None = None
    until: float | None = None
    outcome: str | None = None
    limit: int = 1000


def add_audit(session: Session, records: Sequence[AuditRecord]) -> None:
    """Insert records, all at once."""
    if records:
        rows = [(r.at, r.user, r.method, r.route, r.path, r.address, r.status) for r in records]
        _AUDIT.insert(session.connection(), rows)


def add_session(session: Session, record: AuditRecord) -> int:
    """Insert a session's record (all of its fields, which `add_audit`'s rows of writes do
    not have); its id, to complete it with `end_session`."""
    row = AuditRow(
        at=record.at,
        user=record.user,
        method=record.method,
        route=record.route,
        path=record.path,
        address=record.address,
        status=record.status,
        workload=record.workload,
        task=record.task,
        command=list(record.command) if record.command is not None else None,
    )
    session.add(row)
    session.flush()
    return row.id


def end_session(session: Session, record_id: int, ended_at: float, exit_code: int | None) -> None:
    """Complete a session's record with its end and its command's exit code."""
    row = session.get(AuditRow, record_id)
    if row is not None:
        row.ended_at, row.exit_code = ended_at, exit_code


def list_audit(session: Session, query: AuditQuery) -> list[AuditRecord]:
    """The newest `query.limit` records that pass the filters, oldest first."""
    statement = select(AuditRow).order_by(AuditRow.id.desc()).limit(query.limit)
    if query.user is not None:
        statement = statement.where(AuditRow.user == query.user)
    if query.since is not None:
        statement = statement.where(AuditRow.at >= query.since)
    if query.until is not None:
        statement = statement.where(AuditRow.at < query.until)
    if query.action is not None:
        action = (AuditRow.method + " " + AuditRow.route).contains(query.action, autoescape=True)
        statement = statement.where(action)
    if query.outcome is not None:
        statement = statement.where(*_outcome(query.outcome))
    rows = session.scalars(statement).all()
    return [_record(row) for row in reversed(rows)]


def _outcome(outcome: str) -> list[Any]:
    if len(outcome) == 3 and outcome[0].isdigit() and outcome[1:].lower() == "xx":
        low = int(outcome[0]) * 100
        return [AuditRow.status >= low, AuditRow.status < low + 100]
    return [AuditRow.status == int(outcome)]


def _record(row: AuditRow) -> AuditRecord:
    return AuditRecord(
        row.at,
        row.user,
        row.method,
        row.route,
        row.path,
        row.address,
        row.status,
        workload=row.workload,
        task=row.task,
        command=tuple(row.command) if row.command is not None else None,
        ended_at=row.ended_at,
        exit_code=row.exit_code,
        id=row.id,
    )
