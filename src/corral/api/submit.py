"""The steps of a submission, in one place: who may submit, the account its tasks run as,
the never-fits check (`corral.control.admission`), the dependencies, the request's
Idempotency-Key, a name drawn by the server (and drawn again on the rare clash), and the
audit record committed with the workload. The handlers in `routers/workloads.py` call
`submit_one` and `submit_several`."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from corral.api.audit import record_of, written
from corral.api.deps import may_submit
from corral.api.lifecycle import array_specs, resolve_after
from corral.api.schemas.workloads import WorkloadBatchIn, WorkloadIn
from corral.control.accounts import require_account, require_runnable
from corral.control.plane import ControlPlane
from corral.model.arrays import parse_array
from corral.model.spec import WorkloadSpec, workload_key
from corral.store import Conflict, Invalid, NotFound, Store, UserRecord, WorkloadRecord
from corral.store.idempotency import Idempotency, Replayed

# Draws of a server-made workload name before a clash is reported (each clashes with
# odds of about n / 16.7 million for n workloads in the project).
NAME_ATTEMPTS = 5

T = TypeVar("T")


def idempotency(key: str | None, user: str, body: BaseModel) -> Idempotency | None:
    """The request's key, with the digest of its body as parsed (so that a retry that
    formats its JSON differently is still the same request)."""
    if key is None:
        return None
    return Idempotency(user, key, hashlib.sha256(body.model_dump_json().encode()).hexdigest())


def replayed(store: Store, replay: Replayed) -> list[WorkloadRecord]:
    """The workloads of an earlier request with the same key; 422 when it came with
    another body."""
    if not replay.same:
        raise Invalid(
            "Idempotency-Key",
            f"{replay.key.key!r} was used within 24 h with a different body; "
            "send a new key for a new request",
        )
    return store.replayed(replay)


def require_code(control: ControlPlane, specs: Sequence[WorkloadSpec], batch: bool = False) -> None:
    """422 naming `code` unless the snapshot each workload names is its project's (a
    digest of another project's tree is as unknown as one of no tree)."""
    for index, spec in enumerate(specs):
        if spec.code is None:
            continue
        at: tuple[str | int, ...] = ("workloads", index) if batch else ()
        if control.code is None:
            raise Invalid("code", "this server keeps no code snapshots", at=at)
        if not control.code.has(spec.project, spec.code):
            raise Invalid(
                "code",
                f"project {spec.project} has no code snapshot {spec.code}; upload it first "
                f"(PUT /api/v1/projects/{spec.project}/code/DIGEST; `corral submit --code` does)",
                at=at,
            )


def drawn_name(project: str) -> str:
    """A server-made workload name: project-XXXXXX (24 random bits)."""
    return f"{project}-{secrets.token_hex(3)}"


def drawn(spec: WorkloadSpec) -> WorkloadSpec:
    """`spec` under a name drawn by the server (its key PROJECT/project-XXXXXX)."""
    return replace(spec, name=workload_key(spec.project, drawn_name(spec.project)))


def drawn_again(chosen: Sequence[str], clash: Conflict, attempt: int) -> bool:
    """Whether a submission that clashed on `clash` is tried again with names drawn
    afresh: not when a name the client chose clashes (that is final), nor after the last
    attempt."""
    return attempt < NAME_ATTEMPTS - 1 and not set(chosen) & set(clash.names)


async def named(submit: Callable[[int], Awaitable[T]], chosen: Sequence[str]) -> T:
    """`submit(attempt)`, which draws the names the client left out, tried again while
    only drawn names clash."""
    attempt = 0
    while True:
        try:
            return await submit(attempt)
        except Conflict as clash:
            if not drawn_again(chosen, clash, attempt):
                raise
            attempt += 1


def named_in_thread(submit: Callable[[int], T], chosen: Sequence[str]) -> T:
    """As `named`, for a submission written in this thread."""
    attempt = 0
    while True:
        try:
            return submit(attempt)
        except Conflict as clash:
            if not drawn_again(chosen, clash, attempt):
                raise
            attempt += 1


async def submit_one(
    control: ControlPlane,
    store: Store,
    body: WorkloadIn,
    current: UserRecord,
    scope: Scope,
    key_header: str | None,
) -> tuple[WorkloadRecord, bool]:
    """Submit one workload (or every member of an array); the workload, and whether it is
    the answer given before to the same Idempotency-Key. The checks that need the store
    run in a worker thread, and only when the answer is not in memory."""
    may_submit(current, body.project)
    require_account(control.cluster, current)
    spec = body.to_spec(body.name or body.project, current.name)
    require_code(control, [spec])
    require_runnable(control.cluster, current, [spec])
    if not control.admission.accepts(spec):
        await run_in_threadpool(control.admission.check, spec)
    key = idempotency(key_header, current.name, body)
    if spec.after:
        [spec] = await run_in_threadpool(resolve_after, store, current, [spec])
    # A name the client chose is final: only names drawn here are drawn again on a clash.
    chosen = [spec.name] if body.name else []
    try:
        if body.array is not None:
            after = spec.after

            def members(attempt: int) -> WorkloadRecord:
                name = body.name or drawn_name(body.project)
                made = [replace(m, after=after) for m in array_specs(body, name, current.name)]
                return store.submit_all(made, key)[0]

            if body.name:
                chosen += [f"{spec.name}-{index}" for index in parse_array(body.array)[0]]
            record = await run_in_threadpool(named_in_thread, members, chosen)
            control.loop.trigger()
            return record, False
        # The request's audit record is committed with the workload (one transaction,
        # not two, before the answer).
        audit = record_of(scope, current.name, 201)

        async def one(attempt: int) -> WorkloadRecord:
            chose = spec if body.name else drawn(spec)
            return await control.submissions.submit(chose, key, audit)

        record = await named(one, chosen)
        written(scope, audit)
        return record, False
    except Replayed as replay:
        found = await run_in_threadpool(replayed, store, replay)
        if not found:
            raise NotFound(
                f"the workload of Idempotency-Key {replay.key.key!r} was deleted"
            ) from None
        return found[0], True


def submit_several(
    control: ControlPlane,
    store: Store,
    body: WorkloadBatchIn,
    current: UserRecord,
    key_header: str | None,
) -> tuple[list[WorkloadRecord], bool]:
    """Submit several workloads in one transaction, all or none; the workloads, and
    whether they are the answer given before to the same Idempotency-Key."""
    for index, item in enumerate(body.workloads):
        may_submit(current, item.project)
        if item.array is not None:
            raise Invalid(
                "array", "submit an array on its own (POST /workloads)", at=("workloads", index)
            )
    require_account(control.cluster, current)
    # Each item made a spec once; a name the server draws is drawn afresh for each attempt.
    made = [item.to_spec(item.name or "-", current.name) for item in body.workloads]
    require_code(control, made, batch=True)
    require_runnable(control.cluster, current, made, batch=True)
    if any(spec.after for spec in made):
        made = resolve_after(store, current, made)
    control.admission.check_all(made)
    key = idempotency(key_header, current.name, body)

    def together(attempt: int) -> list[WorkloadRecord]:
        specs = [
            spec if item.name else drawn(spec)
            for item, spec in zip(body.workloads, made, strict=True)
        ]
        return store.submit_all(specs, key)

    chosen = [spec.name for item, spec in zip(body.workloads, made, strict=True) if item.name]
    try:
        records = named_in_thread(together, chosen)
    except Replayed as replay:
        return replayed(store, replay), True
    control.loop.trigger()
    return records, False
