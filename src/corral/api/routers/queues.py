"""Queues: departments and projects, their quotas and rules. Changes are an admin's."""

from __future__ import annotations

from fastapi import APIRouter, Response

from corral.api.deps import API, Admin, LoopDep, StoreDep, User
from corral.api.errors import ERRORS
from corral.api.outputs import queue_out
from corral.api.routes import PrefixedRoute
from corral.api.rules import rules_payload
from corral.api.schemas.queues import QueueIn, QueueOut, QueuePatch
from corral.control.plane import Loop
from corral.model.usage import decay_settings
from corral.store import QueueRecord, Store
from corral.store.rules import queue_rules

router = APIRouter(prefix=API, responses=ERRORS, tags=["queues"], route_class=PrefixedRoute)


def _queue_out(store: Store, loop: Loop, record: QueueRecord) -> QueueOut:
    """One queue's answer, its rules read for it alone."""
    last = loop.last
    # Its inherited time-decayed fair share settings, where the latest cycle used them.
    status = last.queues.get(record.queue.name) if last else None
    settings = (
        decay_settings([r.queue for r in store.list_queues()])
        if status is not None and status.weight is not None
        else None
    )
    return queue_out(record, queue_rules(store, record.queue.name), last, settings)


@router.get("/queues", response_model=list[QueueOut])
def list_queues(_: User, store: StoreDep, loop: LoopDep) -> list[QueueOut]:
    last = loop.last
    listed = store.list_queues_with_rules()
    settings = decay_settings([record.queue for record, _ in listed])
    return [queue_out(record, rules, last, settings) for record, rules in listed]


@router.post("/queues", response_model=QueueOut, status_code=201)
def create_queue(body: QueueIn, _: Admin, store: StoreDep, loop: LoopDep) -> QueueOut:
    record = store.create_queue(body.to_model(), rules_payload(body))
    loop.trigger()
    return _queue_out(store, loop, record)


@router.get("/queues/{name}", response_model=QueueOut)
def get_queue(name: str, _: User, store: StoreDep, loop: LoopDep) -> QueueOut:
    return _queue_out(store, loop, store.get_queue(name))


@router.patch("/queues/{name}", response_model=QueueOut)
def update_queue(name: str, body: QueuePatch, _: Admin, store: StoreDep, loop: LoopDep) -> QueueOut:
    rules = (rules_payload(body) or {}) if "rules" in body.model_fields_set else None
    record = store.update_queue(name, body.changes(), rules)
    loop.trigger()
    return _queue_out(store, loop, record)


@router.delete("/queues/{name}", status_code=204)
def delete_queue(name: str, _: Admin, store: StoreDep, loop: LoopDep) -> Response:
    store.delete_queue(name)
    loop.trigger()
    return Response(status_code=204)
