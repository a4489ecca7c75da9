"""A workload's life after submission: cancel (one, or a whole array), change while it
waits, the history of all work (sacct) and estimated starts (squeue --start). Scoped as
the workload router is: members read their projects' work and manage their own."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from corral.api.deps import (
    API,
    ControlDep,
    ProjectQuery,
    StoreDep,
    User,
    array_key,
    managed_workload,
    may_manage,
    may_read,
    readable_projects,
)
from corral.api.errors import ERRORS
from corral.api.lifecycle import (
    HistoryOut,
    StartOut,
    WorkloadPatch,
    estimated_starts,
    history_out,
)
from corral.api.outputs import Redactor, workload_out
from corral.api.routes import PrefixedRoute
from corral.api.schemas.workloads import WorkloadOut
from corral.store import STATUSES, NotFound
from corral.store.history import HISTORY_LIMIT, HistoryQuery

router = APIRouter(prefix=API, responses=ERRORS, tags=["workloads"], route_class=PrefixedRoute)


@router.post("/workloads/{name}/cancel", response_model=list[WorkloadOut])
def cancel_workload(
    name: str, current: User, store: StoreDep, control: ControlDep, project: ProjectQuery = None
) -> list[WorkloadOut]:
    """Stop a workload, or every unfinished member of the array `name`, and keep its
    record as `cancelled` (who, when); 409 when it has ended already. Returns what was
    cancelled."""
    try:
        single = [managed_workload(store, current, name, project)]
        key = single[0].name
    except NotFound:
        # Not a workload: an array, whose members are all of one project and user.
        single = []
        key = array_key(store, current, name, project)
        members = store.list_workloads(array=key, projects=readable_projects(current))
        if not members:
            raise
        may_manage(current, members[0])
    before, releases = store.cancel(key, current.name)
    control.released(before, releases)
    control.loop.trigger()
    after = store.list_workloads(array=key) if not single else [store.get_workload(key)]
    cancelled = {record.name for record in before}
    redact = Redactor(store, readable_projects(current))
    return [workload_out(record, redact) for record in after if record.name in cancelled]


@router.patch("/workloads/{name}", response_model=WorkloadOut)
def update_workload(
    name: str,
    body: WorkloadPatch,
    current: User,
    store: StoreDep,
    control: ControlDep,
    project: ProjectQuery = None,
) -> WorkloadOut:
    """Change a pending or suspended workload: priority, preemptible, max_runtime,
    backoff_limit, grace_period, node_selector, node_pools. 409 for work that runs or has
    ended; 422 naming a field that cannot change, or where the workload could then never
    run (as at submit)."""
    found = managed_workload(store, current, name, project)
    changes = body.changes()
    control.admission.check(body.changed(found.spec))
    record = store.update_workload(found.name, changes, current.name)
    control.loop.trigger()
    return workload_out(record, Redactor(store, readable_projects(current)))


@router.get("/history", response_model=list[HistoryOut])
def list_history(
    current: User,
    store: StoreDep,
    project: str | None = None,
    user: str | None = None,
    state: Annotated[str | None, Query(pattern="^(" + "|".join(STATUSES) + ")$")] = None,
    since: Annotated[
        float | None, Query(ge=0, le=1e11, description="seconds since the epoch")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=HISTORY_LIMIT)] = 1000,
) -> list[HistoryOut]:
    """Every workload the store keeps, oldest first (the newest `limit`), with its wait
    and run time, GPU-hours, exit code, attempts and evictions; of the caller's projects
    only, for a member."""
    if project is not None and not may_read(current, project):
        return []
    query = HistoryQuery(project, user, state, since, readable_projects(current), limit)
    now = time.time()
    redact = Redactor(store, readable_projects(current))
    rows = [history_out(found, now) for found in store.history(query)]
    for row in rows:
        row.reason = redact(row.reason)
    return rows


@router.get("/starts", response_model=list[StartOut])
def list_starts(current: User, store: StoreDep, project: str | None = None) -> list[StartOut]:
    """The estimated start of each pending workload the caller may read (of `project`
    when given), from the engine: after which running workloads end, by their maximum
    runtime, it would fit; null when that cannot be known."""
    pending = store.list_workloads(
        project=project, status="pending", projects=readable_projects(current)
    )
    return estimated_starts(store, pending)
