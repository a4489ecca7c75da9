"""The durable store: the only code in corral that speaks SQL.

SQLite (WAL mode, full fsync) is the embedded default; PostgreSQL is used by URL. Every
public method that changes state runs in one transaction and under one process-wide write
lock, so that the scheduler loop and API requests never interleave half-done changes.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    Engine,
    Table,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session, selectinload, sessionmaker

from corral.model import (
    Decisions,
    Node,
    Placement,
    Queue,
    Resources,
    Snapshot,
    TaskGroup,
    Topology,
    Workload,
)
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import usage  # noqa: F401  (opens and closes allocation intervals)
from corral.store.errors import Conflict, Invalid, NotFound
from corral.store.records import (
    ACTIVE,
    ROLES,
    STATUSES,
    BoundWork,
    ClusterCounts,
    EventRecord,
    NodeRecord,
    QueueRecord,
    Release,
    TaskOnNode,
    TaskState,
    UserRecord,
    WorkloadRecord,
)
from corral.store.schema import (
    DeviceRow,
    EventRow,
    NodeRow,
    PlacementRow,
    QueueRow,
    TaskGroupRow,
    TokenRow,
    UserRow,
    WorkloadRow,
)
from corral.store.telemetry import idle_workloads

# The tables, for statements that write many rows at once without the ORM.
_WORKLOADS = cast(Table, WorkloadRow.__table__)
_TASK_GROUPS = cast(Table, TaskGroupRow.__table__)
_EVENTS = cast(Table, EventRow.__table__)
MIGRATIONS = Path(__file__).parent / "migrations"
# A running workload whose GPUs were at 0% this long counts as idle for victim choice.
IDLE_WINDOW = 300.0
TOKEN_PREFIX = "crl_"
# How long an authenticated token is trusted without asking the database again. Another
# server sharing a PostgreSQL store sees a change to users or tokens at most this late.
TOKEN_CACHE_SECONDS = 10.0


def database_url(data_dir: Path | None, url: str | None) -> str:
    """The SQLAlchemy URL for `--db URL`, or the embedded SQLite file in `data_dir`."""
    if url:
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            return "postgresql+psycopg://" + url.split("://", 1)[1]
        return url
    if data_dir is None:
        raise ValueError("either a data directory or a database URL is needed")
    return f"sqlite:///{data_dir / 'corral.db'}"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Store:
    """Queues, nodes, workloads, events, users and tokens, durably."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self.engine: Engine = create_engine(
            url,
            pool_pre_ping=not self.sqlite,
            **({"connect_args": {"check_same_thread": False}} if self.sqlite else {}),
        )
        if self.sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_lock = threading.RLock()
        # Token digest -> (user, when it was looked up); see `authenticate`.
        self._tokens: dict[str, tuple[UserRecord, float]] = {}
        # Submissions waiting for a transaction (group commit, see `submit`).
        self._queue_lock = threading.Lock()
        self._queued: list[_Submission] = []
        # Counts committed changes that scheduling depends on (see `_write`).
        self.generation = 0
        self.migrate()

    def migrate(self) -> None:
        """Bring the schema to the newest migration."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the write lock across several calls (the scheduler's cycle does)."""
        with self._write_lock:
            yield

    @contextmanager
    def _write(self, relevant: bool = True) -> Iterator[Session]:
        """One transaction under the write lock. A `relevant` change (the default) is one
        that can make a scheduling cycle computed before it wrong: it bumps `generation`
        once committed."""
        with self._write_lock:
            with self._sessions.begin() as session:
                yield session
            if relevant:
                self.generation += 1

    @contextmanager
    def _accounts(self) -> Iterator[Session]:
        """A transaction that changes users, tokens or queues (which members belong to)."""
        try:
            with self._write() as session:
                yield session
        finally:
            self._tokens.clear()

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    # -- queues --------------------------------------------------------------------------

    def create_queue(self, queue: Queue) -> QueueRecord:
        with self._accounts() as session:
            if _queue_row(session, queue.name, required=False) is not None:
                raise Conflict(f"queue {queue.name!r} already exists")
            parent = None
            if queue.parent is not None:
                parent = _queue_row(session, queue.parent, field="parent")
                if session.scalar(select(WorkloadRow.id).where(WorkloadRow.queue_id == parent.id)):
                    raise Invalid("parent", f"queue {queue.parent!r} holds workloads")
            _check_quota(queue)
            row = QueueRow(
                name=queue.name, parent_id=parent.id if parent else None, created_at=time.time()
            )
            _fill_queue(row, queue)
            session.add(row)
            session.flush()
            _event(session, "queue-created", "api", f"queue {queue.name} created")
            return _queue_record(session, row)

    def update_queue(self, name: str, changes: dict[str, Any]) -> QueueRecord:
        """Change some of a queue's fields: parent, deserved, limit, over_quota_weight, priority."""
        with self._accounts() as session:
            row = _queue_row(session, name)
            current = _queue_model(session, row)
            updated = replace(current, **changes)
            if "parent" in changes and updated.parent != current.parent:
                if updated.parent is None:
                    row.parent_id = None
                else:
                    parent = _queue_row(session, updated.parent, field="parent")
                    chain = _ancestry(session, parent)
                    if row.id in chain:
                        names = " -> ".join([name, *_names_down_to(session, parent, row)])
                        raise Invalid("parent", f"cycle {names}")
                    if session.scalar(
                        select(WorkloadRow.id).where(WorkloadRow.queue_id == parent.id)
                    ):
                        raise Invalid("parent", f"queue {updated.parent!r} holds workloads")
                    row.parent_id = parent.id
            _check_quota(updated)
            _fill_queue(row, updated)
            _event(session, "queue-updated", "api", f"queue {name} changed: {sorted(changes)}")
            return _queue_record(session, row)

    def delete_queue(self, name: str) -> None:
        with self._accounts() as session:
            row = _queue_row(session, name)
            if session.scalar(select(func.count()).where(QueueRow.parent_id == row.id)):
                raise Conflict(f"queue {name!r} has child queues; delete them first")
            held = session.scalar(
                select(func.count())
                .select_from(WorkloadRow)
                .where(
                    WorkloadRow.queue_id == row.id,
                    WorkloadRow.status.not_in(("succeeded", "failed")),
                )
            )
            if held:
                raise Conflict(f"queue {name!r} still holds {held} workloads")
            session.execute(delete(WorkloadRow).where(WorkloadRow.queue_id == row.id))
            session.delete(row)
            _event(session, "queue-deleted", "api", f"queue {name} deleted")

    def get_queue(self, name: str) -> QueueRecord:
        with self._read() as session:
            return _queue_record(session, _queue_row(session, name))

    def list_queues(self) -> list[QueueRecord]:
        with self._read() as session:
            rows = session.scalars(select(QueueRow).order_by(QueueRow.id)).all()
            return [_queue_record(session, row) for row in rows]

    def list_queues_with_rules(self) -> list[tuple[QueueRecord, dict[str, Any]]]:
        """Every queue, as `list_queues` gives them, with the rules set on it itself (as
        `corral.store.rules.queue_rules` gives them), read in one query for all queues."""
        with self._read() as session:
            rows = session.scalars(select(QueueRow).order_by(QueueRow.id)).all()
            names = {row.id: row.name for row in rows}
            children: dict[int, list[str]] = {}
            for row in rows:
                if row.parent_id is not None:
                    children.setdefault(row.parent_id, []).append(row.name)
            return [
                (
                    QueueRecord(
                        _queue_from_row(row, names),
                        tuple(children.get(row.id, ())),
                        row.created_at,
                    ),
                    dict(row.rules or {}),
                )
                for row in rows
            ]

    # -- nodes ---------------------------------------------------------------------------

    def register_node(self, spec: NodeSpec, replace_existing: bool = False) -> NodeRecord:
        """Add a node with its devices. With `replace_existing` (an agent re-registering),
        an existing node's devices and labels are updated and its work is kept."""
        node = spec.node
        if len(spec.devices) != node.gpus:
            raise Invalid("devices", f"{len(spec.devices)} devices listed for {node.gpus} GPUs")
        if sorted(device.index for device in spec.devices) != list(range(node.gpus)):
            raise Invalid("devices", "device indices must be 0 to gpus-1, each once")
        with self._write() as session:
            row = session.scalar(select(NodeRow).where(NodeRow.name == node.name))
            now = time.time()
            if row is not None and not replace_existing:
                raise Conflict(f"node {node.name!r} already exists")
            if row is None:
                row = NodeRow(name=node.name, registered_at=now, schedulable=True)
                session.add(row)
            else:
                used = max(
                    (max(p.devices, default=-1) for p in _node_placements(session, row)),
                    default=-1,
                )
                if used >= node.gpus:
                    raise Conflict(f"node {node.name!r} has work on device {used}")
                row.devices.clear()
                session.flush()
            row.gpu_model = node.gpu_model
            row.gpu_memory = node.gpu_memory
            row.cpu = node.cpu
            row.memory = node.memory
            row.labels = dict(node.labels)
            row.virtual = spec.virtual
            row.state = "ready"
            row.heartbeat_at = now
            row.devices = [
                DeviceRow(
                    index=d.index, uuid=d.uuid, model=d.model, memory=d.memory, virtual=d.virtual
                )
                for d in sorted(spec.devices, key=lambda d: d.index)
            ]
            session.flush()
            _event(session, "node-registered", "api", f"{node.gpus} GPUs", node=node.name)
            return _node_record(session, row)

    def set_schedulable(self, name: str, schedulable: bool) -> NodeRecord:
        with self._write() as session:
            row = _node_row(session, name)
            if row.schedulable != schedulable:
                row.schedulable = schedulable
                kind = "node-uncordoned" if schedulable else "node-cordoned"
                _event(session, kind, "api", "", node=name)
            return _node_record(session, row)

    def remove_node(self, name: str) -> list[str]:
        """Remove a node; its workloads go back to pending. Returns their names."""
        with self._write() as session:
            row = _node_row(session, name)
            requeued = _requeue_node(session, row, f"node {name} was removed")
            session.delete(row)
            _event(session, "node-removed", "api", "", node=name)
            return requeued

    def get_node(self, name: str) -> NodeRecord:
        with self._read() as session:
            return _node_record(session, _node_row(session, name))

    def list_nodes(self) -> list[NodeRecord]:
        with self._read() as session:
            rows = session.scalars(
                select(NodeRow).options(selectinload(NodeRow.devices)).order_by(NodeRow.name)
            ).all()
            return [_node_record(session, row) for row in rows]

    # -- workloads -----------------------------------------------------------------------

    def submit(self, spec: WorkloadSpec) -> WorkloadRecord:
        """Add a pending workload, durably, and return it as stored.

        Group commit: concurrent submissions queue up while another transaction holds the
        write lock, and whichever of them takes the lock next writes every queued one in
        one transaction (one fsync). Each caller returns only once its own submission is
        committed, or with its own error; one bad submission fails no other."""
        item = _Submission(spec, time.time())
        with self._queue_lock:
            self._queued.append(item)
        with self._write_lock:
            if not item.done:
                with self._queue_lock:
                    batch, self._queued = self._queued, []
                self._submit_batch(batch)
        outcome = item.outcome()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def submit_many(self, specs: Sequence[WorkloadSpec]) -> list[WorkloadRecord | Exception]:
        """Add pending workloads in one transaction: for each, what `submit` would return
        or raise. One bad submission fails no other."""
        batch = [_Submission(spec, time.time()) for spec in specs]
        with self._write_lock:
            self._submit_batch(batch)
        return [item.outcome() for item in batch]

    def submit_all(self, specs: Sequence[WorkloadSpec]) -> list[WorkloadRecord]:
        """Add pending workloads all together or not at all, in one transaction. The first
        submission that fails a check fails the whole; an Invalid names it by its place
        (`at=("workloads", i)`)."""
        batch = [_Submission(spec, time.time()) for spec in specs]
        with self._write_lock, self._sessions.begin() as session:
            written = _insert_submissions(session, batch, atomic=True)
        return [record for _, record in written]

    def _submit_batch(self, batch: list[_Submission]) -> None:
        # A new pending workload is not in a cycle's snapshot and changes nothing it
        # decided: submissions do not bump the generation.
        try:
            with self._sessions.begin() as session:
                written = _insert_submissions(session, batch)
        except Exception as error:
            if len(batch) == 1:
                batch[0].error = error
                batch[0].done = True
                return
            # Something none of the checks foresaw: write each alone, so that only the
            # submission at fault fails.
            for item in batch:
                item.error = None
                self._submit_batch([item])
            return
        for item, record in written:
            item.record = record
        for item in batch:
            item.done = True

    def get_workload(self, name: str) -> WorkloadRecord:
        with self._read() as session:
            row = _workload_row(session, name)
            return _workload_record(row, row.queue.name)

    def list_workloads(
        self,
        project: str | None = None,
        status: str | None = None,
        user: str | None = None,
    ) -> list[WorkloadRecord]:
        with self._read() as session:
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
            if status is not None:
                query = query.where(WorkloadRow.status == status)
            if user is not None:
                query = query.where(WorkloadRow.user == user)
            return [_workload_record(row, queue) for row, queue in session.execute(query).all()]

    def delete_workload(self, name: str, cause: str) -> WorkloadRecord:
        """Delete a workload and free its devices. Returns what it was."""
        with self._write() as session:
            row = _workload_row(session, name)
            record = _workload_record(row, row.queue.name)
            session.delete(row)
            _event(session, "deleted", cause, "", workload=name)
            return record

    def suspend(self, name: str, cause: str) -> WorkloadRecord:
        """Take a workload out of scheduling; a running one gives its devices back."""
        with self._write() as session:
            row = _workload_row(session, name)
            if row.status not in ACTIVE:
                raise Conflict(
                    f"workload {name!r} is {row.status}; only pending or running work "
                    "can be suspended"
                )
            record = _workload_record(row, row.queue.name)
            row.placements.clear()
            row.status = "suspended"
            row.reason = f"suspended by {cause}"
            _event(session, "suspended", cause, "", workload=name)
            return record

    def resume(self, name: str, cause: str) -> WorkloadRecord:
        with self._write() as session:
            row = _workload_row(session, name)
            if row.status != "suspended":
                raise Conflict(f"workload {name!r} is {row.status}, not suspended")
            row.status = "pending"
            row.reason = None
            _event(session, "resumed", cause, "", workload=name)
            session.flush()
            return _workload_record(row, row.queue.name)

    def events(self, workload: str | None = None, limit: int = 1000) -> list[EventRecord]:
        with self._read() as session:
            query = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
            if workload is not None:
                query = query.where(EventRow.workload == workload)
            rows = list(reversed(session.scalars(query).all()))
            return [
                EventRecord(r.id, r.time, r.workload, r.node, r.kind, r.cause, r.reason)
                for r in rows
            ]

    # -- scheduling ----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Pending and running work, every queue and node, as the engine reads them."""
        return self.read_snapshot()[0]

    def read_snapshot(self) -> tuple[Snapshot, int]:
        """The snapshot, and the newest workload id it has read (see `new_workloads`)."""
        with self._read() as session:
            queues = session.scalars(select(QueueRow).order_by(QueueRow.id)).all()
            names = {row.id: row.name for row in queues}
            gpus = dict(
                session.execute(
                    select(DeviceRow.node_id, func.count()).group_by(DeviceRow.node_id)
                ).all()
            )
            nodes = [
                (
                    row.id,
                    Node(
                        name=row.name,
                        gpus=gpus.get(row.id, 0),
                        gpu_memory=row.gpu_memory,
                        gpu_model=row.gpu_model,
                        cpu=row.cpu,
                        memory=row.memory,
                        labels=row.labels,
                        schedulable=row.schedulable and row.state == "ready",
                    ),
                )
                for row in session.execute(
                    select(
                        NodeRow.id,
                        NodeRow.name,
                        NodeRow.gpu_model,
                        NodeRow.gpu_memory,
                        NodeRow.cpu,
                        NodeRow.memory,
                        NodeRow.labels,
                        NodeRow.schedulable,
                        NodeRow.state,
                    ).order_by(NodeRow.name)
                )
            ]
            node_names = {node_id: node.name for node_id, node in nodes}
            # Victims whose GPUs sat idle are preferred among otherwise equal ones.
            idle = idle_workloads(session, time.time(), IDLE_WINDOW)
            workloads, newest = _active_workloads(session, names, node_names, idle, after=0)
            snapshot = Snapshot(
                nodes=tuple(node for _, node in nodes),
                queues=tuple(_queue_from_row(row, names) for row in queues),
                workloads=workloads,
            )
            return snapshot, newest

    def new_workloads(self, after: int) -> tuple[tuple[Workload, ...], int]:
        """Active workloads with an id above `after` (submitted since a snapshot that read
        up to `after`), and the newest id read. Submissions commit one at a time under the
        write lock, so ids become visible in order and none is skipped."""
        with self._read() as session:
            names = dict(session.execute(select(QueueRow.id, QueueRow.name)).all())
            node_names = dict(session.execute(select(NodeRow.id, NodeRow.name)).all())
            return _active_workloads(session, names, node_names, set(), after)

    def apply(self, decisions: Decisions) -> list[Release]:
        """Write one cycle's decisions in one transaction: evictions, bindings, reasons.

        Returns the evicted tasks, whose processes must now be stopped."""
        with self._write() as session:
            now = time.time()
            releases = self._apply_evictions(session, decisions)
            names = set(decisions.bindings) | set(decisions.pending)
            # Plain rows and statements run once for many rows: a burst of submissions
            # binds hundreds of workloads in one cycle.
            found = (
                {
                    row.name: row
                    for row in session.execute(
                        select(
                            WorkloadRow.id, WorkloadRow.name, WorkloadRow.status, WorkloadRow.reason
                        ).where(WorkloadRow.name.in_(names))
                    )
                }
                if names
                else {}
            )
            if decisions.bindings:
                node_ids = dict(session.execute(select(NodeRow.name, NodeRow.id)).all())
                session.add_all(
                    PlacementRow(
                        workload_id=found[name].id,
                        task=placement.task,
                        node_id=node_ids[placement.node],
                        devices=list(placement.devices),
                        gpu=placement.gpu,
                        created_at=now,
                    )
                    for name, placements in decisions.bindings.items()
                    for placement in placements
                )
                session.flush()
                table = _WORKLOADS
                session.connection().execute(
                    update(table)
                    .where(table.c.id == bindparam("workload_id"))
                    .values(
                        status="running",
                        reason=None,
                        started_at=func.coalesce(table.c.started_at, now),
                        attempts=case(
                            (table.c.status == "running", table.c.attempts),
                            else_=table.c.attempts + 1,
                        ),
                    ),
                    [{"workload_id": found[name].id} for name in decisions.bindings],
                )
                _events(
                    session,
                    [
                        _event_values(
                            now,
                            "bound",
                            "scheduler",
                            f"{len(placements)} {'task' if len(placements) == 1 else 'tasks'} "
                            f"on {', '.join(sorted({p.node for p in placements}))}",
                            workload=name,
                        )
                        for name, placements in decisions.bindings.items()
                    ],
                )
            reasons = [
                {"workload_id": row.id, "reason": reason}
                for name, reason in decisions.pending.items()
                if (row := found.get(name)) is not None
                and row.status == "pending"
                and row.reason != reason
            ]
            if reasons:
                table = _WORKLOADS
                session.connection().execute(
                    update(table)
                    .where(table.c.id == bindparam("workload_id"))
                    .values(reason=bindparam("reason")),
                    reasons,
                )
            return releases

    def _apply_evictions(self, session: Session, decisions: Decisions) -> list[Release]:
        if not decisions.evictions:
            return []
        rows = {
            row.name: row
            for row in session.scalars(
                select(WorkloadRow)
                .where(WorkloadRow.name.in_({e.workload for e in decisions.evictions}))
                .options(selectinload(WorkloadRow.placements))
            ).all()
        }
        releases = []
        for eviction in decisions.evictions:
            row = rows[eviction.workload]
            gone = set(eviction.tasks)
            why = f"preempted: {eviction.action} for {eviction.by}: {eviction.reason}"
            releases.extend(_releases(row, gone, why))
            row.placements[:] = [p for p in row.placements if p.task not in gone]
            if not row.placements:
                row.status = "pending"
                row.reason = why
            _event(session, "preempted", eviction.action, why, workload=eviction.workload)
        # Written before the bindings, which may give the same workload new placements.
        session.flush()
        return releases

    # -- tasks and agents ----------------------------------------------------------------

    def bound_work(self, node: str | None = None, names: set[str] | None = None) -> list[BoundWork]:
        """Running workloads with their bound tasks: those with a task on `node`, or those
        named, or all."""
        with self._read() as session:
            query = (
                select(WorkloadRow)
                .where(WorkloadRow.status == "running")
                .options(
                    selectinload(WorkloadRow.task_groups),
                    selectinload(WorkloadRow.placements)
                    .selectinload(PlacementRow.node)
                    .selectinload(NodeRow.devices),
                )
                .order_by(WorkloadRow.id)
            )
            if names is not None:
                query = query.where(WorkloadRow.name.in_(names))
            work = []
            for row in session.scalars(query).all():
                if node is not None and not any(p.node.name == node for p in row.placements):
                    continue
                tasks = tuple(
                    TaskState(
                        task=p.task,
                        node=p.node.name,
                        address=p.node.address,
                        devices=tuple(p.devices),
                        gpu=p.gpu,
                        device_memory=p.node.gpu_memory,
                        state=p.state,
                        pid=p.pid,
                        proc_start=p.proc_start,
                    )
                    for p in row.placements
                )
                work.append(BoundWork(_workload_record(row, row.queue.name), tasks))
            return work

    def task_started(self, workload: str, task: int, pid: int, proc_start: int) -> bool:
        """Record a task's process; False when the task is no longer bound (stop it)."""
        with self._write(relevant=False) as session:
            placement = _placement(session, workload, task)
            if placement is None:
                return False
            placement.state = "running"
            placement.pid = pid
            placement.proc_start = proc_start
            _event(
                session,
                "task-started",
                "agent",
                f"task {task} pid {pid}",
                workload=workload,
                node=placement.node.name,
            )
            return True

    def task_ended(
        self, workload: str, task: int, exit_code: int | None, reason: str
    ) -> list[Release]:
        """A task's process ended. A task that is no longer bound (evicted, suspended,
        deleted) changes nothing more. Otherwise exit 0 marks the task done, and the
        workload succeeds when every task is; any other end stops the rest of the gang and
        sends the workload back to pending, or to failed once its retries are used up.
        Returns the sibling tasks to stop."""
        with self._write() as session:
            placement = _placement(session, workload, task)
            row = session.scalar(select(WorkloadRow).where(WorkloadRow.name == workload))
            if placement is None or row is None:
                return []
            node = placement.node.name
            if exit_code == 0:
                placement.state = "exited"
                placement.exit_code = 0
                _event(
                    session,
                    "task-exited",
                    "agent",
                    f"task {task}: {reason}",
                    workload=workload,
                    node=node,
                )
                total = sum(group.replicas for group in row.task_groups)
                done = [p for p in row.placements if p.state == "exited"]
                if len(done) == len(row.placements) and len(row.placements) >= min(
                    total, row.min_available or total
                ):
                    row.placements.clear()
                    row.status = "succeeded"
                    row.reason = None
                    row.finished_at = time.time()
                    _event(
                        session,
                        "succeeded",
                        "agent",
                        "every task exited with code 0",
                        workload=workload,
                    )
                return []
            why = f"task {task} on {node} {reason}"
            releases = _releases(
                row,
                {p.task for p in row.placements if p.task != task and p.state != "exited"},
                f"stopped: {why}",
            )
            row.placements.clear()
            row.failures += 1
            if row.failures <= row.backoff_limit:
                row.status = "pending"
                row.reason = f"retrying ({row.failures} of {row.backoff_limit}): {why}"
                _event(session, "retrying", "agent", why, workload=workload, node=node)
            else:
                row.status = "failed"
                row.reason = why
                row.finished_at = time.time()
                _event(session, "failed", "agent", why, workload=workload, node=node)
            return releases

    def heartbeat(self, node: str) -> None:
        """The node's agent is alive; an unavailable node becomes ready again."""
        revived = False
        with self._write(relevant=False) as session:
            row = session.scalar(select(NodeRow).where(NodeRow.name == node))
            if row is None:
                return
            row.heartbeat_at = time.time()
            if row.state != "ready":
                row.state = "ready"
                revived = True
                _event(session, "node-ready", "agent", "heartbeat resumed", node=node)
        if revived:
            self.generation += 1

    def expire_nodes(self, timeout: float) -> list[str]:
        """Mark nodes whose agent has not been heard from for `timeout` seconds unavailable,
        and send their workloads back to pending (a gang as a whole). Returns the nodes."""
        with self._write() as session:
            limit = time.time() - timeout
            rows = session.scalars(
                select(NodeRow).where(NodeRow.state == "ready", NodeRow.heartbeat_at < limit)
            ).all()
            for row in rows:
                row.state = "unavailable"
                _event(
                    session,
                    "node-unavailable",
                    "monitor",
                    f"no heartbeat for {timeout:g} s",
                    node=row.name,
                )
                _requeue_node(session, row, f"node {row.name} stopped responding")
            return [row.name for row in rows]

    # -- users and tokens ----------------------------------------------------------------

    def ensure_admin(self) -> str | None:
        """Create the first admin and return its token, or None when users exist already."""
        with self._accounts() as session:
            if session.scalar(select(func.count()).select_from(UserRow)):
                return None
            user = UserRow(name="admin", role="admin", created_at=time.time())
            session.add(user)
            session.flush()
            return _new_token(session, user)

    def create_user(self, name: str, role: str, project: str | None) -> tuple[UserRecord, str]:
        """Create a user with a first token; returns the user and the token."""
        if role not in ROLES:
            raise Invalid("role", f"{role!r} is not one of {', '.join(ROLES)}")
        if role == "member" and project is None:
            raise Invalid("project", "a member needs a project")
        if role != "member" and project is not None:
            raise Invalid("project", f"only members belong to a project, not a {role}")
        with self._accounts() as session:
            if session.scalar(select(UserRow.id).where(UserRow.name == name)):
                raise Conflict(f"user {name!r} already exists")
            queue = _queue_row(session, project, field="project") if project else None
            user = UserRow(
                name=name, role=role, project_id=queue.id if queue else None, created_at=time.time()
            )
            session.add(user)
            session.flush()
            token = _new_token(session, user)
            _event(session, "user-created", "api", f"{name} ({role})")
            return UserRecord(name, role, project), token

    def create_token(self, user: str) -> str:
        with self._accounts() as session:
            row = session.scalar(select(UserRow).where(UserRow.name == user))
            if row is None:
                raise NotFound(f"user {user!r} not found")
            return _new_token(session, row)

    def list_users(self) -> list[UserRecord]:
        with self._read() as session:
            rows = session.scalars(select(UserRow).order_by(UserRow.id)).all()
            return [UserRecord(r.name, r.role, r.project.name if r.project else None) for r in rows]

    def remembered(self, token: str) -> UserRecord | None:
        """The token's user if `authenticate` found it a short while ago; no database."""
        known = self._tokens.get(digest(token))
        if known is not None and time.monotonic() - known[1] < TOKEN_CACHE_SECONDS:
            return known[0]
        return None

    def authenticate(self, token: str) -> UserRecord | None:
        """The token's user, or None. Users found are remembered for a short while (every
        API request authenticates); a change to users, tokens or queues forgets them."""
        known = self.remembered(token)
        if known is not None:
            return known
        key = digest(token)
        with self._read() as session:
            row = session.scalar(select(TokenRow).where(TokenRow.digest == key))
            if row is None:
                return None
            user = row.user
            found = UserRecord(user.name, user.role, user.project.name if user.project else None)
        self._tokens[key] = (found, time.monotonic())
        return found

    # -- summaries ---------------------------------------------------------------------

    def counts(self) -> ClusterCounts:
        """Nodes, GPUs, allocation, workloads by status and queues, without loading rows."""
        with self._read() as session:
            nodes = session.execute(
                select(
                    func.count(),
                    func.count().filter(NodeRow.state == "ready"),
                ).select_from(NodeRow)
            ).one()
            devices = session.execute(
                select(func.count(), func.count().filter(DeviceRow.virtual)).select_from(DeviceRow)
            ).one()
            statuses = dict.fromkeys(STATUSES, 0)
            statuses.update(
                session.execute(
                    select(WorkloadRow.status, func.count()).group_by(WorkloadRow.status)
                ).all()
            )
            return ClusterCounts(
                nodes=nodes[0],
                nodes_ready=nodes[1],
                gpus=devices[0],
                virtual_gpus=devices[1],
                gpus_allocated=session.scalar(
                    select(func.coalesce(func.sum(PlacementRow.gpu), 0.0))
                )
                or 0.0,
                workloads=statuses,
                queues=session.scalar(select(func.count()).select_from(QueueRow)) or 0,
            )

    # -- checks --------------------------------------------------------------------------

    def integrity_problems(self) -> list[str]:
        """Everything that contradicts the store's invariants (empty when it is sound)."""
        problems = []
        with self._read() as session:
            nodes = {row.id: row for row in session.scalars(select(NodeRow)).all()}
            usage: dict[tuple[int, int], float] = {}
            for placement in session.scalars(select(PlacementRow)).all():
                node = nodes.get(placement.node_id)
                workload = placement.workload
                if workload.status != "running":
                    problems.append(f"{workload.name} is {workload.status} but holds a placement")
                if node is None:
                    problems.append(f"{workload.name} is placed on a missing node")
                    continue
                indices = {device.index for device in node.devices}
                for device in placement.devices:
                    if device not in indices:
                        problems.append(
                            f"{workload.name} uses {node.name} device {device}, "
                            "which does not exist"
                        )
                    share = placement.gpu / len(placement.devices)
                    usage[(node.id, device)] = usage.get((node.id, device), 0.0) + share
            for (node_id, device), used in sorted(usage.items()):
                if used > 1.0 + 1e-6:
                    problems.append(
                        f"{nodes[node_id].name} device {device} is committed {used:.2f} times"
                    )
            running = session.scalars(
                select(WorkloadRow).where(WorkloadRow.status == "running")
            ).all()
            for workload in running:
                if not workload.placements:
                    problems.append(f"{workload.name} is running without placements")
        return problems


# -- helpers -------------------------------------------------------------------------------


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # FULL: a transaction that returned is on disk, even if the machine loses power.
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def _event(
    session: Session,
    kind: str,
    cause: str,
    reason: str,
    workload: str | None = None,
    node: str | None = None,
) -> None:
    session.add(
        EventRow(
            time=time.time(), workload=workload, node=node, kind=kind, cause=cause, reason=reason
        )
    )


def _event_values(
    now: float,
    kind: str,
    cause: str,
    reason: str,
    workload: str | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    return {
        "time": now,
        "workload": workload,
        "node": node,
        "kind": kind,
        "cause": cause,
        "reason": reason,
    }


def _events(session: Session, values: list[dict[str, Any]]) -> None:
    """Many events in one statement."""
    if values:
        session.connection().execute(insert(_EVENTS), values)


@dataclass(slots=True)
class _Submission:
    """A submission waiting for its transaction (see `Store.submit`)."""

    spec: WorkloadSpec
    at: float
    done: bool = False
    record: WorkloadRecord | None = None
    error: Exception | None = None

    def outcome(self) -> WorkloadRecord | Exception:
        if self.error is not None:
            return self.error
        if self.record is None:
            raise RuntimeError(f"submission {self.spec.name!r} was not written")
        return self.record


def _insert_submissions(
    session: Session, batch: list[_Submission], atomic: bool = False
) -> list[tuple[_Submission, WorkloadRecord]]:
    """Check and insert a batch of submissions; those that fail a check get their error
    and are not written. `atomic`: the first failure is raised, and nothing written."""
    projects = {item.spec.project for item in batch}
    queues = dict(
        session.execute(select(QueueRow.name, QueueRow.id).where(QueueRow.name.in_(projects))).all()
    )
    departments = set(
        session.scalars(select(QueueRow.parent_id).where(QueueRow.parent_id.in_(queues.values())))
    )
    existing = set(
        session.scalars(
            select(WorkloadRow.name).where(WorkloadRow.name.in_({i.spec.name for i in batch}))
        )
    )
    taken: set[str] = set()
    accepted = []
    for index, item in enumerate(batch):
        spec = item.spec
        queue = queues.get(spec.project)
        if spec.name in existing:
            item.error = Conflict(f"workload {spec.name!r} already exists")
        elif spec.name in taken:
            item.error = Conflict(f"workload {spec.name!r} is submitted twice")
        elif queue is None:
            item.error = Invalid("project", f"unknown queue {spec.project!r}")
        elif queue in departments:
            item.error = Invalid(
                "project", f"{spec.project!r} is a department; submit to a project"
            )
        else:
            taken.add(spec.name)
            accepted.append((item, queue))
            continue
        if atomic:
            error = item.error
            if isinstance(error, Invalid):
                raise Invalid(error.field, error.message, at=("workloads", index))
            raise error
    if not accepted:
        return []
    workloads = _WORKLOADS
    connection = session.connection()
    ids = (
        connection.execute(
            insert(workloads).returning(workloads.c.id, sort_by_parameter_order=True),
            [_workload_values(item.spec, queue, item.at) for item, queue in accepted],
        )
        .scalars()
        .all()
    )
    connection.execute(
        insert(_TASK_GROUPS),
        [
            {
                "workload_id": workload_id,
                "ordinal": ordinal,
                "name": group.name,
                "replicas": group.replicas,
                "gpu": group.gpu,
                "gpu_memory": group.gpu_memory,
                "cpu": group.cpu,
                "memory": group.memory,
            }
            for (item, _), workload_id in zip(accepted, ids, strict=True)
            for ordinal, group in enumerate(item.spec.task_groups)
        ],
    )
    _events(
        session,
        [
            _event_values(
                item.at, "submitted", item.spec.user, f"to {item.spec.project}", item.spec.name
            )
            for item, _ in accepted
        ],
    )
    return [
        (item, WorkloadRecord(workload_id, item.spec, "pending", None, 0, item.at, None, None, ()))
        for (item, _), workload_id in zip(accepted, ids, strict=True)
    ]


def _workload_values(spec: WorkloadSpec, queue_id: int, at: float) -> dict[str, Any]:
    return {
        "name": spec.name,
        "queue_id": queue_id,
        "user": spec.user,
        "priority": spec.priority,
        "preemptible": spec.preemptible,
        "min_available": spec.min_available,
        "node_selector": {key: list(values) for key, values in spec.node_selector.items()},
        "topology_key": spec.topology.key if spec.topology else None,
        "topology_required": spec.topology.required if spec.topology else True,
        "command": list(spec.command),
        "env": dict(spec.env),
        "workdir": spec.workdir,
        "max_runtime": spec.max_runtime,
        "backoff_limit": spec.backoff_limit,
        "grace_period": spec.grace_period,
        "status": "pending",
        "reason": None,
        "attempts": 0,
        "failures": 0,
        "created_at": at,
        "started_at": None,
        "finished_at": None,
    }


def _active_workloads(
    session: Session,
    queues: dict[int, str],
    nodes: dict[int, str],
    idle: set[str],
    after: int,
) -> tuple[tuple[Workload, ...], int]:
    """Pending and running workloads with an id above `after`, as the engine reads them,
    and the newest id among them (`after` when there is none). Plain rows, not ORM
    objects, and only the columns the engine reads: this runs every cycle."""
    active = WorkloadRow.status.in_(ACTIVE)
    rows = session.execute(
        select(
            WorkloadRow.id,
            WorkloadRow.name,
            WorkloadRow.queue_id,
            WorkloadRow.priority,
            WorkloadRow.preemptible,
            WorkloadRow.min_available,
            WorkloadRow.node_selector,
            WorkloadRow.topology_key,
            WorkloadRow.topology_required,
        )
        .where(active, WorkloadRow.id > after)
        .order_by(WorkloadRow.id)
    ).all()
    if not rows:
        return (), after
    # Task groups and placements of the workloads just read, and of no later ones: a
    # workload and its task groups are committed together, so every row read has its own.
    newest: int = rows[-1].id
    span = (WorkloadRow.id > after, WorkloadRow.id <= newest)
    groups: dict[int, list[TaskGroup]] = {}
    for g in session.execute(
        select(
            TaskGroupRow.workload_id,
            TaskGroupRow.name,
            TaskGroupRow.replicas,
            TaskGroupRow.gpu,
            TaskGroupRow.gpu_memory,
            TaskGroupRow.cpu,
            TaskGroupRow.memory,
        )
        .join(WorkloadRow, TaskGroupRow.workload_id == WorkloadRow.id)
        .where(active, *span)
        .order_by(TaskGroupRow.workload_id, TaskGroupRow.ordinal)
    ):
        groups.setdefault(g[0], []).append(TaskGroup(*g[1:]))
    placed: dict[int, list[Placement]] = {}
    for p in session.execute(
        select(
            PlacementRow.workload_id,
            PlacementRow.task,
            PlacementRow.node_id,
            PlacementRow.devices,
            PlacementRow.gpu,
        )
        .join(WorkloadRow, PlacementRow.workload_id == WorkloadRow.id)
        .where(active, *span)
        .order_by(PlacementRow.workload_id, PlacementRow.task)
    ):
        placed.setdefault(p[0], []).append(Placement(p[1], nodes[p[2]], tuple(p[3]), p[4]))
    workloads = tuple(
        Workload(
            name=w.name,
            queue=queues[w.queue_id],
            task_groups=tuple(groups.get(w.id, ())),
            priority=w.priority,
            preemptible=w.preemptible,
            min_available=w.min_available,
            node_selector={k: tuple(v) for k, v in w.node_selector.items()},
            topology=(Topology(w.topology_key, w.topology_required) if w.topology_key else None),
            submitted=float(w.id),
            placements=tuple(placed.get(w.id, ())),
            idle=w.name in idle,
        )
        for w in rows
    )
    return workloads, newest


def _new_token(session: Session, user: UserRow) -> str:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(TokenRow(user_id=user.id, digest=digest(token), created_at=time.time()))
    return token


def _queue_row(session: Session, name: str, field: str = "name", required: bool = True) -> QueueRow:
    row = session.scalar(select(QueueRow).where(QueueRow.name == name))
    if row is None and required:
        if field == "name":
            raise NotFound(f"queue {name!r} not found")
        raise Invalid(field, f"unknown queue {name!r}")
    return row  # type: ignore[return-value]


def _node_row(session: Session, name: str) -> NodeRow:
    row = session.scalar(select(NodeRow).where(NodeRow.name == name))
    if row is None:
        raise NotFound(f"node {name!r} not found")
    return row


def _workload_row(session: Session, name: str) -> WorkloadRow:
    row = session.scalar(select(WorkloadRow).where(WorkloadRow.name == name))
    if row is None:
        raise NotFound(f"workload {name!r} not found")
    return row


def _ancestry(session: Session, row: QueueRow) -> list[int]:
    chain = []
    current: QueueRow | None = row
    while current is not None:
        chain.append(current.id)
        current = current.parent
    return chain


def _names_down_to(session: Session, parent: QueueRow, target: QueueRow) -> list[str]:
    """Names from `parent` up its ancestry to `target`, for a cycle message."""
    names = []
    current: QueueRow | None = parent
    while current is not None:
        names.append(current.name)
        if current.id == target.id:
            break
        current = current.parent
    return names


def _optional(value: float) -> float | None:
    return None if math.isinf(value) else value


def _check_quota(queue: Queue) -> None:
    for resource in Resources.NAMES:
        deserved = queue.deserved.get(resource)
        limit = queue.limit.get(resource)
        if deserved < 0:
            raise Invalid(f"deserved.{resource}", "must be 0 or more")
        if limit < 0:
            raise Invalid(f"limit.{resource}", "must be 0 or more")
        if queue.over_quota_weight.get(resource) < 0:
            raise Invalid(f"over_quota_weight.{resource}", "must be 0 or more")
        if math.isfinite(deserved) and limit < deserved:
            raise Invalid(f"limit.{resource}", f"{limit:g} is below deserved {deserved:g}")


def _fill_queue(row: QueueRow, queue: Queue) -> None:
    row.deserved_gpu = queue.deserved.gpu
    row.deserved_cpu = _optional(queue.deserved.cpu)
    row.deserved_memory = _int_or_none(queue.deserved.memory)
    row.limit_gpu = _optional(queue.limit.gpu)
    row.limit_cpu = _optional(queue.limit.cpu)
    row.limit_memory = _int_or_none(queue.limit.memory)
    row.weight_gpu = queue.over_quota_weight.gpu
    row.weight_cpu = queue.over_quota_weight.cpu
    row.weight_memory = queue.over_quota_weight.memory
    row.priority = queue.priority


def _int_or_none(value: float) -> int | None:
    return None if math.isinf(value) else int(value)


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else float(value)


def _queue_from_row(row: QueueRow, names: dict[int, str]) -> Queue:
    return Queue(
        name=row.name,
        parent=names[row.parent_id] if row.parent_id is not None else None,
        deserved=Resources(
            row.deserved_gpu, _or_inf(row.deserved_cpu), _or_inf(row.deserved_memory)
        ),
        limit=Resources(_or_inf(row.limit_gpu), _or_inf(row.limit_cpu), _or_inf(row.limit_memory)),
        over_quota_weight=Resources(row.weight_gpu, row.weight_cpu, row.weight_memory),
        priority=row.priority,
    )


def _queue_model(session: Session, row: QueueRow) -> Queue:
    names = dict(session.execute(select(QueueRow.id, QueueRow.name)).all())
    return _queue_from_row(row, names)


def _queue_record(session: Session, row: QueueRow) -> QueueRecord:
    children = session.scalars(
        select(QueueRow.name).where(QueueRow.parent_id == row.id).order_by(QueueRow.id)
    ).all()
    return QueueRecord(_queue_model(session, row), tuple(children), row.created_at)


def _node_model(row: NodeRow) -> Node:
    return Node(
        name=row.name,
        gpus=len(row.devices),
        gpu_memory=row.gpu_memory,
        gpu_model=row.gpu_model,
        cpu=row.cpu,
        memory=row.memory,
        labels=dict(row.labels),
        schedulable=row.schedulable and row.state == "ready",
    )


def _node_placements(session: Session, row: NodeRow) -> list[PlacementRow]:
    return list(session.scalars(select(PlacementRow).where(PlacementRow.node_id == row.id)).all())


def _node_record(session: Session, row: NodeRow) -> NodeRecord:
    tasks = []
    for placement in _node_placements(session, row):
        workload = placement.workload
        tasks.append(
            TaskOnNode(
                workload.name,
                workload.queue.name,
                placement.task,
                tuple(placement.devices),
                placement.gpu,
            )
        )
    return NodeRecord(
        node=replace(_node_model(row), schedulable=row.schedulable),
        devices=tuple(Device(d.index, d.uuid, d.model, d.memory, d.virtual) for d in row.devices),
        virtual=row.virtual,
        state=row.state,
        registered_at=row.registered_at,
        heartbeat_at=row.heartbeat_at,
        tasks=tuple(sorted(tasks, key=lambda t: (t.devices, t.workload, t.task))),
    )


def _placement(session: Session, workload: str, task: int) -> PlacementRow | None:
    return session.scalar(
        select(PlacementRow)
        .join(WorkloadRow, PlacementRow.workload_id == WorkloadRow.id)
        .where(WorkloadRow.name == workload, PlacementRow.task == task)
    )


def _releases(row: WorkloadRow, tasks: set[int], reason: str) -> list[Release]:
    """The tasks of `row` among `tasks`, grouped by node."""
    by_node: dict[str, list[int]] = {}
    for placement in row.placements:
        if placement.task in tasks:
            by_node.setdefault(placement.node.name, []).append(placement.task)
    return [
        Release(row.name, node, tuple(sorted(numbers)), reason)
        for node, numbers in sorted(by_node.items())
    ]


def _requeue_node(session: Session, row: NodeRow, why: str) -> list[str]:
    """Send every workload with a task on `row` back to pending, a gang as a whole."""
    # IN, not DISTINCT: PostgreSQL cannot compare the JSON columns DISTINCT would.
    affected = session.scalars(
        select(WorkloadRow)
        .where(
            WorkloadRow.id.in_(
                select(PlacementRow.workload_id).where(PlacementRow.node_id == row.id)
            )
        )
        .order_by(WorkloadRow.id)
    ).all()
    for workload in affected:
        workload.placements.clear()
        workload.status = "pending"
        workload.reason = why
        _event(session, "requeued", "node", why, workload=workload.name, node=row.name)
    return [workload.name for workload in affected]


def _spec(row: WorkloadRow, project: str) -> WorkloadSpec:
    return WorkloadSpec(
        name=row.name,
        project=project,
        user=row.user,
        task_groups=tuple(
            TaskGroup(g.name, g.replicas, g.gpu, g.gpu_memory, g.cpu, g.memory)
            for g in row.task_groups
        ),
        priority=row.priority,
        preemptible=row.preemptible,
        min_available=row.min_available,
        node_selector={key: tuple(values) for key, values in row.node_selector.items()},
        topology=Topology(row.topology_key, row.topology_required) if row.topology_key else None,
        command=tuple(row.command),
        env=dict(row.env),
        workdir=row.workdir,
        max_runtime=row.max_runtime,
        backoff_limit=row.backoff_limit,
        grace_period=row.grace_period,
    )


def _workload_record(row: WorkloadRow, project: str) -> WorkloadRecord:
    return WorkloadRecord(
        id=row.id,
        spec=_spec(row, project),
        status=row.status,
        reason=row.reason,
        attempts=row.attempts,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        placements=tuple(
            Placement(p.task, p.node.name, tuple(p.devices), p.gpu) for p in row.placements
        ),
    )
