"""Workloads: submitting (one or a batch), reading, stopping and resuming them, their
events, logs and why they wait. Members read their projects' work only (another
project's workload is 404, as if it did not exist) and manage their own workloads; a
project's project-admins manage all of its workloads; viewers read all; admins do all."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from corral.api.deps import (
    API,
    ControlDep,
    LoopDep,
    ProjectQuery,
    StoreDep,
    User,
    application,
    array_key,
    managed_workload,
    readable_projects,
    visible_workload,
    workload_by_key,
)
from corral.api.errors import ERRORS
from corral.api.logs import read_log
from corral.api.outputs import Redactor, json_answer, vars_of, workload_fields, workload_out
from corral.api.routes import PrefixedRoute
from corral.api.schemas.workloads import (
    EventOut,
    LogOut,
    WhyOut,
    WorkloadBatchIn,
    WorkloadIn,
    WorkloadOut,
)
from corral.api.submit import submit_one, submit_several
from corral.api.why import why_out
from corral.control import explain
from corral.control.watch import RECHECK_SECONDS
from corral.model.spec import short_name
from corral.store import (
    FINISHED,
    STATUSES,
    EventRecord,
    Invalid,
    NotFound,
    Store,
    UserRecord,
)

router = APIRouter(prefix=API, responses=ERRORS, tags=["workloads"], route_class=PrefixedRoute)
# The header of an answer given again for a retried request (Idempotency-Key).
REPLAYED = {"Idempotent-Replayed": "true"}


# A retried submission sends the same key: the first answer is given again.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="a retry with the same key (and body) within 24 h returns the first "
        "answer instead of submitting again; the same key with another body is 422",
    ),
]


@router.get("/workloads", response_model=list[WorkloadOut])
def list_workloads(
    current: User,
    store: StoreDep,
    project: str | None = None,
    status: Annotated[str | None, Query(pattern="^(" + "|".join(STATUSES) + ")$")] = None,
    user: str | None = None,
    array: Annotated[str | None, Query(max_length=63, description="members of this array")] = None,
) -> Response:
    """Workloads, oldest first, filtered by project, status, user or array; a member sees
    only the workloads of the projects they belong to."""
    if array is not None:
        try:
            array = array_key(store, current, array, project)
        except NotFound:
            return json_answer([])
    found = store.list_workloads(project, status, user, readable_projects(current), array)
    redact = Redactor(store, readable_projects(current))
    return json_answer([redact.fields(workload_fields(r)) for r in found])


@router.post("/workloads", response_model=WorkloadOut, status_code=201)
async def submit(
    body: WorkloadIn,
    current: User,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    # Async, unlike the other handlers: the writer thread commits submissions in
    # batches (corral.control.submissions) and wakes the scheduler.
    store, control = application(request)
    record, again = await submit_one(control, store, body, current, request.scope, idempotency_key)
    return json_answer(workload_fields(record), 201, REPLAYED if again else None)


@router.post("/workloads/batch", response_model=list[WorkloadOut], status_code=201)
def submit_batch(
    body: WorkloadBatchIn,
    current: User,
    store: StoreDep,
    control: ControlDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Submit several workloads in one transaction: all are stored, or none (the
    first that fails a check is named by its place, `workloads[i]`). With an
    Idempotency-Key, a retry gives the first answer again."""
    records, again = submit_several(control, store, body, current, idempotency_key)
    return json_answer([workload_fields(r) for r in records], 201, REPLAYED if again else None)


# The longest a request may wait for a workload (`until`), in seconds.
MAX_WAIT = 60.0
DEFAULT_WAIT = 30.0


@router.get("/workloads/{name}", response_model=WorkloadOut)
async def get_workload(
    name: str,
    current: User,
    request: Request,
    project: ProjectQuery = None,
    until: Annotated[
        str | None,
        Query(
            pattern="^(" + "|".join(STATUSES) + ")$",
            description="answer once the workload is in this status or has ended (succeeded, "
            "failed, cancelled), or after `wait` seconds, whichever comes first: the status "
            "in the answer tells which",
        ),
    ] = None,
    wait: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_WAIT,
            description=f"seconds to wait for `until` at most (default {DEFAULT_WAIT:g})",
        ),
    ] = None,
) -> Response:
    """A workload; with `until`, as soon as it reaches that status (a client waiting for
    its submission to start asks `until=running` rather than polling)."""
    # The busiest read. Async: FastAPI checks what a plain function returns in a worker
    # thread of its own, a second trip after the one that ran it; here only the store is
    # read in one. The store and the control plane from the request, not as dependencies.
    store, control = application(request)
    if until is None:
        if wait is not None:
            raise Invalid("wait", "give `until` too: the status to wait for")
        return json_answer(await run_in_threadpool(read, store, current, name, project))
    deadline = time.monotonic() + (DEFAULT_WAIT if wait is None else wait)
    key = (await run_in_threadpool(visible_workload, store, current, name, project)).name
    with control.changes.watching(key, current.name) as changed:
        while True:
            # Cleared before the look: a change announced during it is not missed.
            if changed is not None:
                changed.clear()
            fields = await run_in_threadpool(read, store, current, key, None, True)
            left = deadline - time.monotonic()
            done = fields["status"] == until or fields["status"] in FINISHED or left <= 0
            if done or changed is None:
                return json_answer(fields)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(left, RECHECK_SECONDS))


def read(
    store: Store, current: UserRecord, name: str, project: str | None, by_key: bool = False
) -> dict[str, Any]:
    """The workload as `current` may read it (`by_key`: `name` is its key), as plain
    data, in one worker thread."""
    found = (
        workload_by_key(store, current, name)
        if by_key
        else visible_workload(store, current, name, project)
    )
    return Redactor(store, readable_projects(current)).fields(workload_fields(found))


@router.delete("/workloads/{name}", status_code=204)
def delete_workload(
    name: str, current: User, store: StoreDep, control: ControlDep, project: ProjectQuery = None
) -> Response:
    key = managed_workload(store, current, name, project).name
    deleted, releases = store.delete_workload(key, current.name)
    control.released([deleted], releases)
    control.forget(deleted)
    control.loop.trigger()
    return Response(status_code=204)


@router.post("/workloads/{name}/suspend", response_model=WorkloadOut)
def suspend(
    name: str, current: User, store: StoreDep, control: ControlDep, project: ProjectQuery = None
) -> WorkloadOut:
    key = managed_workload(store, current, name, project).name
    suspended, releases = store.suspend(key, current.name)
    control.released([suspended], releases)
    control.loop.trigger()
    return workload_out(store.get_workload(key), Redactor(store, readable_projects(current)))


@router.post("/workloads/{name}/resume", response_model=WorkloadOut)
def resume(
    name: str, current: User, store: StoreDep, loop: LoopDep, project: ProjectQuery = None
) -> WorkloadOut:
    key = managed_workload(store, current, name, project).name
    record = store.resume(key, current.name)
    loop.trigger()
    return workload_out(record, Redactor(store, readable_projects(current)))


@router.get("/workloads/{name}/events", response_model=list[EventOut])
async def workload_events(
    name: str, current: User, store: StoreDep, project: ProjectQuery = None
) -> list[EventOut]:
    # Async, its store reads in one worker thread (see `get_workload`).
    found = await run_in_threadpool(visible_events, store, current, name, project)
    redact = Redactor(store, readable_projects(current))
    return [
        EventOut(
            **{
                **vars_of(event),
                "workload": short_name(event.workload or "") or None,
                "cause": redact(event.cause),
                "reason": redact(event.reason),
            }
        )
        for event in found
    ]


def visible_events(
    store: Store, current: UserRecord, name: str, project: str | None
) -> list[EventRecord]:
    """The events of workload `name`, which `current` must be allowed to read: of this
    workload, by its id, not those of an earlier (deleted) workload of the same name."""
    return store.events(workload_id=visible_workload(store, current, name, project).id)


@router.get("/workloads/{name}/logs", response_model=LogOut)
def logs(
    name: str,
    current: User,
    store: StoreDep,
    control: ControlDep,
    task: Annotated[int, Query(ge=0, le=4095)] = 0,
    offset: Annotated[int, Query(ge=0)] = 0,
    tail: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    project: ProjectQuery = None,
) -> LogOut:
    record = visible_workload(store, current, name, project)
    return read_log(control.data_dir, record, task, offset, tail)


@router.get("/workloads/{name}/why", response_model=WhyOut)
def why(
    name: str, current: User, store: StoreDep, loop: LoopDep, project: ProjectQuery = None
) -> WhyOut:
    record = visible_workload(store, current, name, project)
    answer = why_out(explain.why(store, record, readable_projects(current), loop.last))
    answer.reason = Redactor(store, readable_projects(current))(answer.reason)
    return answer
