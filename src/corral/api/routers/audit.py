"""The audit log of writes, for admins: filtered, as JSON or as JSON lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from corral.api.deps import API, Admin, StoreDep
from corral.api.errors import ERRORS
from corral.api.routes import PrefixedRoute
from corral.api.schemas.accounts import AuditOut
from corral.store.audit import AuditQuery

router = APIRouter(prefix=API, responses=ERRORS, tags=["audit"], route_class=PrefixedRoute)
MAX_RECORDS = 100_000


def audit_query(
    user: str | None = None,
    action: Annotated[
        str | None,
        Query(max_length=255, description='part of "METHOD route", e.g. "POST /api/v1/workloads"'),
    ] = None,
    since: Annotated[float | None, Query(description="seconds since the epoch")] = None,
    until: Annotated[float | None, Query(description="seconds since the epoch, excluded")] = None,
    outcome: Annotated[
        str | None, Query(pattern=r"^([1-5]xx|[1-5][0-9][0-9])$", description='"403" or "4xx"')
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_RECORDS)] = 1000,
) -> AuditQuery:
    """The filters of both audit endpoints, from the query string."""
    return AuditQuery(user, action, since, until, outcome, limit)


Filters = Annotated[AuditQuery, Depends(audit_query)]


@router.get("/audit", response_model=list[AuditOut])
def list_audit(_: Admin, store: StoreDep, query: Filters) -> list[AuditOut]:
    """The newest `limit` write requests that pass the filters, oldest first."""
    return [AuditOut(**asdict(record)) for record in store.list_audit(query)]


@router.get(
    "/audit/export",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
def export_audit(_: Admin, store: StoreDep, query: Filters) -> StreamingResponse:
    """The same records as `GET /audit`, as JSON lines (one object per line)."""
    records = store.list_audit(query)

    def lines() -> Iterator[str]:
        for record in records:
            yield json.dumps(AuditOut(**asdict(record)).model_dump()) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
