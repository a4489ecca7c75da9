"""Queues: the tree of departments and projects, their quotas and their rules."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from corral.model import Queue, QueueError, check_quota, check_tree
from corral.store.convert import fill_queue, queue_from_row, queue_names, queue_record
from corral.store.errors import Conflict, Invalid, NotFound
from corral.store.events import add_event
from corral.store.records import FINISHED, QueueRecord
from corral.store.schema import QueueRow, WorkloadRow


def queue_row(session: Session, name: str, field: str = "name") -> QueueRow:
    """The queue's row. A missing queue is NotFound when it is the object asked for
    (`field` "name"), and Invalid naming `field` when another object refers to it."""
    row = find_queue_row(session, name)
    if row is None:
        if field == "name":
            raise NotFound(f"queue {name!r} not found")
        raise Invalid(field, f"unknown queue {name!r}")
    return row


def find_queue_row(session: Session, name: str) -> QueueRow | None:
    """The queue's row, or None."""
    return session.scalar(select(QueueRow).where(QueueRow.name == name))


def create_queue(session: Session, queue: Queue) -> QueueRecord:
    """Add a queue under an existing parent that holds no workloads."""
    if find_queue_row(session, queue.name) is not None:
        raise Conflict(f"queue {queue.name!r} already exists")
    parent = None
    if queue.parent is not None:
        parent = queue_row(session, queue.parent, field="parent")
        _check_holds_no_workloads(session, parent)
    _check_quota(queue)
    row = QueueRow(name=queue.name, parent_id=parent.id if parent else None, created_at=time.time())
    fill_queue(row, queue)
    session.add(row)
    session.flush()
    add_event(session, "queue-created", "api", f"queue {queue.name} created")
    return queue_record(session, row)


def update_queue(session: Session, name: str, changes: Mapping[str, Any]) -> QueueRecord:
    """Change some of a queue's fields: parent, deserved, limit, over_quota_weight, priority,
    preempt_min_runtime, reclaim_min_runtime, fair_share_half_life, fair_share_k,
    reserve_after."""
    row = queue_row(session, name)
    names = queue_names(session)
    current = queue_from_row(row, names)
    updated = replace(current, **changes)
    if "parent" in changes and updated.parent != current.parent:
        if updated.parent is None:
            row.parent_id = None
        else:
            parent = queue_row(session, updated.parent, field="parent")
            _check_no_cycle(session, updated, names)
            _check_holds_no_workloads(session, parent)
            row.parent_id = parent.id
    _check_quota(updated)
    fill_queue(row, updated)
    add_event(session, "queue-updated", "api", f"queue {name} changed: {sorted(changes)}")
    return queue_record(session, row)


def delete_queue(session: Session, name: str) -> None:
    """Delete a queue with no child queues and no unfinished workloads (its finished ones
    go with it)."""
    row = queue_row(session, name)
    if session.scalar(select(func.count()).where(QueueRow.parent_id == row.id)):
        raise Conflict(f"queue {name!r} has child queues; delete them first")
    held = session.scalar(
        select(func.count())
        .select_from(WorkloadRow)
        .where(
            WorkloadRow.queue_id == row.id,
            WorkloadRow.status.not_in(FINISHED),
        )
    )
    if held:
        raise Conflict(f"queue {name!r} still holds {held} workloads")
    session.execute(delete(WorkloadRow).where(WorkloadRow.queue_id == row.id))
    session.delete(row)
    add_event(session, "queue-deleted", "api", f"queue {name} deleted")


def list_queues(session: Session) -> list[QueueRecord]:
    """Every queue, oldest first."""
    return [record for record, _ in list_queues_with_rules(session)]


def list_queues_with_rules(session: Session) -> list[tuple[QueueRecord, dict[str, Any]]]:
    """Every queue, oldest first, with the rules set on it itself, from one query (not one
    per queue for its children and parent)."""
    rows = session.scalars(select(QueueRow).order_by(QueueRow.id)).all()
    names = {row.id: row.name for row in rows}
    children: dict[int, list[str]] = {}
    for row in rows:
        if row.parent_id is not None:
            children.setdefault(row.parent_id, []).append(row.name)
    return [
        (
            QueueRecord(
                queue_from_row(row, names), tuple(children.get(row.id, ())), row.created_at
            ),
            dict(row.rules or {}),
        )
        for row in rows
    ]


def _check_holds_no_workloads(session: Session, parent: QueueRow) -> None:
    # A queue with workloads is a project; projects cannot become departments.
    if session.scalar(select(WorkloadRow.id).where(WorkloadRow.queue_id == parent.id)):
        raise Invalid("parent", f"queue {parent.name!r} holds workloads")


def _check_quota(queue: Queue) -> None:
    try:
        check_quota(queue)
    except QueueError as error:
        raise Invalid(error.field, error.message) from None
    for pool, quota in queue.pools.items():
        try:
            check_quota(replace(queue, deserved=quota.deserved, limit=quota.limit))
        except QueueError as error:
            # Named as the request names it: pools.POOL.limit.gpu.
            *within, field = error.field.split(".")
            raise Invalid(field, error.message, ("pools", pool, *within)) from None


def _check_no_cycle(session: Session, updated: Queue, names: dict[int, str]) -> None:
    # The changed queue listed first: a cycle it closes is named starting from it.
    others = [
        queue_from_row(row, names)
        for row in session.scalars(select(QueueRow).where(QueueRow.name != updated.name))
    ]
    try:
        check_tree([updated, *others])
    except QueueError as error:
        raise Invalid(error.field, error.message) from None
