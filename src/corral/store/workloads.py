"""Workloads: submission (checked and inserted in batches) and listing."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, Connection, Table, bindparam, exists, func, or_, select
from sqlalchemy.orm import Session, aliased, selectinload

from corral.model import Placement, TaskGroup
from corral.model.spec import KEY_SEPARATOR, WorkloadSpec, short_name, workload_key
from corral.store.audit import AuditRecord, add_audit
from corral.store.bulk import Rows, one_of
from corral.store.convert import (
    WORKLOAD_COLUMNS,
    record_of,
    waiting_reason,
    workload_record,
    workload_values,
)
from corral.store.errors import Conflict, Invalid, NotFound
from corral.store.events import add_events, event_values
from corral.store.idempotency import Idempotency, Replayed, find, remember
from corral.store.records import WorkloadRecord
from corral.store.schema import (
    EventRow,
    NodeRow,
    PlacementRow,
    QueueRow,
    SecretRow,
    TaskGroupRow,
    WorkloadRow,
)

# The tables, for statements that write many rows at once without the ORM.
WORKLOADS = cast(Table, WorkloadRow.__table__)
_NEW_WORKLOADS = Rows(WORKLOADS, WORKLOAD_COLUMNS, key=("name",))
# With their ids, on SQLite (see `_next_ids`).
_NEW_WORKLOADS_BY_ID = Rows(WORKLOADS, ("id", *WORKLOAD_COLUMNS))
# The highest workload id ever given: of the workloads, and of the events, which outlive
# their workloads.
_HIGHEST_IDS = select(
    select(func.max(WorkloadRow.id)).scalar_subquery(),
    select(func.max(EventRow.workload_id)).scalar_subquery(),
)
# A task group's columns in the order of `TaskGroup`'s fields.
TASK_GROUP_COLUMNS = (
    TaskGroupRow.name,
    TaskGroupRow.replicas,
    TaskGroupRow.gpu,
    TaskGroupRow.gpu_memory,
    TaskGroupRow.cpu,
    TaskGroupRow.memory,
)
_NEW_TASK_GROUPS = Rows(
    cast(Table, TaskGroupRow.__table__),
    ("workload_id", "ordinal", *(column.key for column in TASK_GROUP_COLUMNS)),
)

# A submission's checks, made once: building them (an alias above all) cost more than
# running them. Each project's queue, and whether it has queues below it (a department).
_CHILD = aliased(QueueRow)
_QUEUES = select(QueueRow.name, QueueRow.id, exists().where(_CHILD.parent_id == QueueRow.id)).where(
    one_of(QueueRow.name, "projects")
)
# The workloads and arrays that hold one of the names.
_CLAIMED = (
    select(WorkloadRow.name, WorkloadRow.array_name, QueueRow.name)
    .join(QueueRow, WorkloadRow.queue_id == QueueRow.id)
    .where(
        or_(
            one_of(WorkloadRow.name, "names"),
            one_of(WorkloadRow.array_name, "names"),
        )
    )
)


def workload_row(session: Session, name: str) -> WorkloadRow:
    """The workload's row; NotFound when there is none."""
    row = session.scalar(select(WorkloadRow).where(WorkloadRow.name == name))
    if row is None:
        raise NotFound(f"workload {name!r} not found")
    return row


def workload_id(session: Session, name: str) -> int | None:
    """The id of the workload named `name` now; None when there is none."""
    found: int | None = session.scalar(select(WorkloadRow.id).where(WorkloadRow.name == name))
    return found


@dataclass(slots=True)
class Submission:
    """A submission on its way into its transaction (see `Store.submit_many`)."""

    spec: WorkloadSpec
    at: float
    record: WorkloadRecord | None = None
    error: Exception | None = None
    # The request's Idempotency-Key, written in the same transaction as the workload.
    idempotency: Idempotency | None = None
    # The request's audit record, written with the workload (not when it is refused).
    audit: AuditRecord | None = None

    def outcome(self) -> WorkloadRecord | Exception:
        """The stored workload, or the error that kept it out."""
        if self.error is not None:
            return self.error
        if self.record is None:
            raise RuntimeError(f"submission {self.spec.name!r} was not written")
        return self.record


def insert_submissions(
    session: Session, batch: list[Submission], atomic: bool = False
) -> list[tuple[Submission, WorkloadRecord]]:
    """Check and insert a batch of submissions; those that fail a check get their error
    and are not written. `atomic`: the first failure is raised, and nothing written.

    A submission whose Idempotency-Key was used before gets `Replayed` (naming what the
    first request created) instead of being written; so does a second one with the same
    key in this batch (two concurrent retries), once the first is."""
    followers = _replays(session, batch)
    accepted = _check_submissions(session, batch, atomic)
    written = _insert(session, accepted) if accepted else []
    for item, _ in written:
        if item.idempotency is not None:
            remember(session, item.idempotency, [item.spec.name], item.at)
    add_audit(session, [item.audit for item, _ in written if item.audit is not None])
    for item, leader in followers:
        if leader.error is not None:
            item.error = leader.error
        else:
            assert item.idempotency is not None and leader.idempotency is not None
            same = item.idempotency.digest == leader.idempotency.digest
            item.error = Replayed(item.idempotency, [leader.spec.name], same)
    return written


def _replays(session: Session, batch: list[Submission]) -> list[tuple[Submission, Submission]]:
    """Give the submissions whose key was used before `Replayed`; return those whose key
    an earlier one in the batch has, each with that earlier one."""
    keyed = [item for item in batch if item.idempotency is not None]
    if not keyed:
        return []
    seen = find(session, [item.idempotency for item in keyed if item.idempotency])
    leaders: dict[tuple[str, str], Submission] = {}
    followers = []
    for item in keyed:
        assert item.idempotency is not None
        wanted = (item.idempotency.user, item.idempotency.key)
        if wanted in seen:
            item.error = seen[wanted]
        elif wanted in leaders:
            followers.append((item, leaders[wanted]))
            # Not an error of its own: set after the leader's outcome is known.
            item.error = Replayed(item.idempotency, [], False)
        else:
            leaders[wanted] = item
    return followers


def _insert(
    session: Session, accepted: list[tuple[Submission, int]]
) -> list[tuple[Submission, WorkloadRecord]]:
    connection = session.connection()
    values = [workload_values(item.spec, queue, item.at) for item, queue in accepted]
    if connection.dialect.name == "sqlite":
        ids = _next_ids(connection, len(values))
        _NEW_WORKLOADS_BY_ID.insert(
            connection, [(i, *row) for i, row in zip(ids, values, strict=True)]
        )
    else:
        ids = _NEW_WORKLOADS.insert_ids(connection, values)
    _NEW_TASK_GROUPS.insert(
        connection,
        [
            (workload_id, ordinal, g.name, g.replicas, g.gpu, g.gpu_memory, g.cpu, g.memory)
            for (item, _), workload_id in zip(accepted, ids, strict=True)
            for ordinal, g in enumerate(item.spec.task_groups)
        ],
    )
    add_events(
        session,
        [
            event_values(
                item.at,
                "submitted",
                item.spec.user,
                f"to {item.spec.project}",
                (item.spec.name, workload_id),
            )
            for (item, _), workload_id in zip(accepted, ids, strict=True)
        ],
    )
    return [
        (
            item,
            WorkloadRecord(
                workload_id,
                item.spec,
                "pending",
                waiting_reason(item.spec),
                0,
                item.at,
                None,
                None,
                (),
            ),
        )
        for (item, _), workload_id in zip(accepted, ids, strict=True)
    ]


def _next_ids(connection: Connection, count: int) -> list[int]:
    """`count` workload ids never given before. A workload's id keys its past (events,
    logs, its own directory), so it must never be given again. SQLite gives a new row the
    highest id in the table plus one, which is a deleted workload's when the newest was
    deleted; a PostgreSQL sequence never gives an id twice."""
    workloads, events = connection.execute(_HIGHEST_IDS).one()
    first = max(workloads or 0, events or 0) + 1
    return list(range(first, first + count))


def _check_submissions(
    session: Session, batch: list[Submission], atomic: bool
) -> list[tuple[Submission, int]]:
    """The submissions that pass every check, with their queue's id; the others get their
    error (raised at once when `atomic`)."""
    connection = session.connection()
    # One statement each for queues and names: a submission alone pays every one of them.
    queues: dict[str, int] = {}
    departments: set[int] = set()
    projects = list({item.spec.project for item in batch})
    for name, queue_id, parent in connection.execute(_QUEUES, {"projects": projects}):
        queues[name] = queue_id
        if parent:
            departments.add(queue_id)
    # An array's name names its members as a group (cancel, list): it is no other
    # array's and no workload's, and no workload takes an array's name.
    names = {i.spec.name for i in batch}
    arrays = {i.spec.array.name for i in batch if i.spec.array is not None}
    grouped = names | arrays
    existing: set[str] = set()
    claimed: set[str] = set()
    # A workload of before names were per project is kept under its bare name: it holds
    # that name in its project as PROJECT/NAME would.
    bare = {short_name(key) for key in grouped}
    for name, array, project in connection.execute(_CLAIMED, {"names": list(grouped | bare)}):
        held_as = _as_keys(name, project)
        existing |= held_as & names
        claimed |= held_as & arrays
        if array is not None:
            claimed |= _as_keys(array, project) & grouped
    held = _secrets_held(session, batch)
    wanted = {d.workload for item in batch for d in item.spec.after}
    known = (
        set(session.scalars(select(WorkloadRow.name).where(WorkloadRow.name.in_(wanted))))
        if wanted
        else set()
    )
    taken: set[str] = set()
    accepted = []
    for index, item in enumerate(batch):
        if item.error is not None:  # a replayed Idempotency-Key
            continue
        spec = item.spec
        queue = queues.get(spec.project)
        missing = sorted({n for n in spec.secrets.values() if (spec.project, n) not in held})
        if spec.name in existing:
            item.error = Conflict(
                f"workload {short_name(spec.name)!r} already exists in {spec.project}",
                (spec.name,),
            )
        elif (group := spec.array.name if spec.array else spec.name) in claimed:
            item.error = Conflict(
                f"{short_name(group)!r} already names an array or a workload in {spec.project}",
                (group,),
            )
        elif spec.name in taken:
            item.error = Conflict(
                f"workload {short_name(spec.name)!r} is submitted twice", (spec.name,)
            )
        elif queue is None:
            item.error = Invalid("project", f"unknown queue {spec.project!r}")
        elif queue in departments:
            item.error = Invalid(
                "project", f"{spec.project!r} is a department; submit to a project"
            )
        elif missing:
            item.error = Invalid(
                "secrets", f"{spec.project} has no secret {', '.join(map(repr, missing))}"
            )
        elif unknown := [d.workload for d in spec.after if d.workload not in known | taken]:
            item.error = Invalid("after", f"no workload {unknown[0]!r} to wait for")
        else:
            taken.add(spec.name)
            accepted.append((item, queue))
            continue
        if atomic:
            error = item.error
            if isinstance(error, Invalid):
                raise Invalid(error.field, error.message, at=("workloads", index))
            raise error
    return accepted


def _as_keys(name: str, project: str) -> set[str]:
    """The names a stored workload (or array) holds: its key, and a bare name of before
    names were per project also as PROJECT/NAME."""
    return {name} if KEY_SEPARATOR in name else {name, workload_key(project, name)}


def _secrets_held(session: Session, batch: list[Submission]) -> set[tuple[str, str]]:
    """(project, secret name) of the secrets the batch refers to that exist."""
    wanted = {(i.spec.project, name) for i in batch for name in i.spec.secrets.values()}
    if not wanted:
        return set()
    rows = session.execute(
        select(QueueRow.name, SecretRow.name)
        .join(QueueRow, SecretRow.queue_id == QueueRow.id)
        .where(
            QueueRow.name.in_({p for p, _ in wanted}), SecretRow.name.in_({n for _, n in wanted})
        )
    ).all()
    return {(project, name) for project, name in rows}


# A workload by name, for `get_workload`: statements made once, run on the connection
# (clients poll a workload they wait for; the ORM's objects and lazy loads cost a read
# four statements and about a millisecond).
_NAMED = (
    select(WORKLOADS, QueueRow.name.label("project"))
    .join(QueueRow, WORKLOADS.c.queue_id == QueueRow.id)
    .where(WORKLOADS.c.name == bindparam("name"))
)
_GROUPS_OF = (
    select(*TASK_GROUP_COLUMNS)
    .where(TaskGroupRow.workload_id == bindparam("id"))
    .order_by(TaskGroupRow.ordinal)
)
_PLACEMENTS_OF = (
    select(PlacementRow.task, NodeRow.name, PlacementRow.devices, PlacementRow.gpu)
    .join(NodeRow, PlacementRow.node_id == NodeRow.id)
    .where(PlacementRow.workload_id == bindparam("id"))
    .order_by(PlacementRow.task)
)


def get_workload(session: Session, name: str) -> WorkloadRecord:
    """The workload; NotFound when there is none."""
    connection = session.connection()
    row = connection.execute(_NAMED, {"name": name}).first()
    if row is None:
        raise NotFound(f"workload {name!r} not found")
    groups = tuple(TaskGroup(*g) for g in connection.execute(_GROUPS_OF, {"id": row.id}))
    placements = tuple(
        Placement(task, node, tuple(devices), gpu)
        for task, node, devices, gpu in connection.execute(_PLACEMENTS_OF, {"id": row.id})
    )
    return record_of(row, row.project, groups, placements)


def list_workloads_named(session: Session, names: list[str]) -> list[WorkloadRecord]:
    """The workloads among `names` that exist, oldest first."""
    return list_workloads(session, None, None, None, names=names)


def _called(column: Any, name: str, projects: Collection[str] | None) -> ColumnElement[bool]:
    """`column` (a workload's or an array's key) names `name` in its project: PROJECT/NAME
    for one of `projects` (any, when None), or the bare NAME of before names were per
    project. A LIKE on the key's end also matches longer names: callers keep the exact."""
    if projects is not None:
        keys = [name, *(workload_key(project, name) for project in sorted(projects))]
        return cast(ColumnElement[bool], column.in_(keys))
    pattern = f"%{KEY_SEPARATOR}{name}".replace("_", "\\_")
    return or_(column == name, column.like(pattern, escape="\\"))


def find_named(
    session: Session, name: str, projects: Collection[str] | None
) -> list[WorkloadRecord]:
    """The workloads called `name` in their project (key PROJECT/NAME, or the bare NAME of a
    workload of before names were per project), of `projects` only when given, oldest
    first."""
    query = (
        select(WorkloadRow, QueueRow.name)
        .join(QueueRow, WorkloadRow.queue_id == QueueRow.id)
        .where(_called(WorkloadRow.name, name, projects))
        .options(
            selectinload(WorkloadRow.task_groups),
            selectinload(WorkloadRow.placements).selectinload(PlacementRow.node),
        )
        .order_by(WorkloadRow.id)
    )
    if projects is not None:
        query = query.where(QueueRow.name.in_(sorted(projects)))
    found = [workload_record(row, queue) for row, queue in session.execute(query).all()]
    return [record for record in found if short_name(record.name) == name]


def find_arrays(session: Session, name: str, projects: Collection[str] | None) -> list[str]:
    """The keys of the arrays called `name` in their project (as `find_named` finds
    workloads), of `projects` only when given."""
    query = (
        select(WorkloadRow.array_name, QueueRow.name)
        .join(QueueRow, WorkloadRow.queue_id == QueueRow.id)
        .where(_called(WorkloadRow.array_name, name, projects))
        .distinct()
    )
    return sorted(
        array
        for array, project in session.execute(query).all()
        if array is not None
        and short_name(array) == name
        and (projects is None or project in projects)
    )


def list_workloads(
    session: Session,
    project: str | None,
    status: str | None,
    user: str | None,
    projects: Collection[str] | None = None,
    names: list[str] | None = None,
    array: str | None = None,
) -> list[WorkloadRecord]:
    """Workloads, oldest first, of one project, status, user or array, or among `names`,
    when given, and of `projects` only when given."""
    query = (
        select(WorkloadRow, QueueRow.name)
        .join(QueueRow, WorkloadRow.queue_id == QueueRow.id)
        .options(
            selectinload(WorkloadRow.task_groups),
            selectinload(WorkloadRow.placements).selectinload(PlacementRow.node),
        )
        .order_by(WorkloadRow.id)
    )
    if project is not None:
        query = query.where(QueueRow.name == project)
    if projects is not None:
        query = query.where(QueueRow.name.in_(sorted(projects)))
    if status is not None:
        query = query.where(WorkloadRow.status == status)
    if user is not None:
        query = query.where(WorkloadRow.user == user)
    if names is not None:
        query = query.where(WorkloadRow.name.in_(names))
    if array is not None:
        query = query.where(WorkloadRow.array_name == array)
    return [workload_record(row, queue) for row, queue in session.execute(query).all()]
