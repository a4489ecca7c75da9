"""The database schema. Alembic migrations in `corral/store/migrations` create it.

Times are seconds since the epoch (float), so that SQLite and PostgreSQL store them alike.
Memory amounts are bytes. A NULL limit means unlimited; a NULL CPU or memory `deserved`
means that resource is not managed for the queue (see `corral.model.Queue`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from corral.model import DEFAULT_GRACE_PERIOD

NAME = 63  # DNS-label length, as Kubernetes uses for object names
# A workload's key: PROJECT/NAME (corral.model.spec.workload_key).
KEY = 2 * NAME + 1


class Base(DeclarativeBase):
    pass


class QueueRow(Base):
    """A department or project."""

    __tablename__ = "queues"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("queues.id", ondelete="RESTRICT"))
    deserved_gpu: Mapped[float] = mapped_column(Float, default=0.0)
    deserved_cpu: Mapped[float | None] = mapped_column(Float)
    deserved_memory: Mapped[int | None] = mapped_column(BigInteger)
    limit_gpu: Mapped[float | None] = mapped_column(Float)
    limit_cpu: Mapped[float | None] = mapped_column(Float)
    limit_memory: Mapped[int | None] = mapped_column(BigInteger)
    weight_gpu: Mapped[float] = mapped_column(Float, default=1.0)
    weight_cpu: Mapped[float] = mapped_column(Float, default=1.0)
    weight_memory: Mapped[float] = mapped_column(Float, default=1.0)
    priority: Mapped[int] = mapped_column(Integer, default=100)
    # Seconds a workload must have run before it is a victim; NULL inherits the parent's.
    preempt_min_runtime: Mapped[float | None] = mapped_column(Float)
    reclaim_min_runtime: Mapped[float | None] = mapped_column(Float)
    # Time-decayed fair share: half-life in seconds and usage factor; NULL inherits.
    fair_share_half_life: Mapped[float | None] = mapped_column(Float)
    fair_share_k: Mapped[float | None] = mapped_column(Float)

    # Seconds the head workload waits before it gets a reservation (backfill); NULL
    # inherits (0011_backfill).
    reserve_after: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    # Rules that act on utilisation, by workload class (corral.store.rules); NULL for none.
    rules: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Quotas by node pool (convert.pools_json); NULL for none.
    pools: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    parent: Mapped[QueueRow | None] = relationship(remote_side=[id])


class NodeRow(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    gpu_model: Mapped[str] = mapped_column(String(NAME), default="generic")
    gpu_memory: Mapped[int] = mapped_column(BigInteger)
    cpu: Mapped[float] = mapped_column(Float)
    memory: Mapped[int] = mapped_column(BigInteger)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Cordoned nodes keep their work but take no new work.
    schedulable: Mapped[bool] = mapped_column(Boolean, default=True)
    # "ready", or "unavailable" when its agent stopped heartbeating.
    state: Mapped[str] = mapped_column(String(16), default="ready")
    virtual: Mapped[bool] = mapped_column(Boolean, default=False)
    # Where the node's tasks reach each other (MASTER_ADDR of a gang).
    address: Mapped[str] = mapped_column(String(255), default="127.0.0.1")
    registered_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)

    devices: Mapped[list[DeviceRow]] = relationship(
        back_populates="node", cascade="all, delete-orphan", order_by="DeviceRow.index"
    )


class DeviceRow(Base):
    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("node_id", "index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(NAME))
    memory: Mapped[int] = mapped_column(BigInteger)
    virtual: Mapped[bool] = mapped_column(Boolean, default=False)

    node: Mapped[NodeRow] = relationship(back_populates="devices")


class WorkloadRow(Base):
    __tablename__ = "workloads"
    __table_args__ = (
        Index("ix_workloads_status", "status"),
        Index("ix_workloads_array", "array_name"),
        Index("ix_workloads_held", "held"),
    )

    # The id also orders workloads by age: a smaller id was submitted earlier.
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Its key, PROJECT/NAME (a bare NAME for a workload of before 0020_keys).
    name: Mapped[str] = mapped_column(String(KEY), unique=True)
    queue_id: Mapped[int] = mapped_column(ForeignKey("queues.id", ondelete="RESTRICT"))
    user: Mapped[str] = mapped_column(String(NAME))
    priority: Mapped[int] = mapped_column(Integer)
    preemptible: Mapped[bool] = mapped_column(Boolean)
    min_available: Mapped[int | None] = mapped_column(Integer)
    node_selector: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Node pools in order of preference; NULL (or empty): any pool.
    node_pools: Mapped[list[Any] | None] = mapped_column(JSON)
    topology_key: Mapped[str | None] = mapped_column(String(NAME))
    topology_required: Mapped[bool] = mapped_column(Boolean, default=True)
    command: Mapped[list[Any]] = mapped_column(JSON, default=list)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Environment variable -> secret name; NULL for workloads from before 0003.
    secrets: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=dict)
    workdir: Mapped[str | None] = mapped_column(Text)
    max_runtime: Mapped[float | None] = mapped_column(Float)
    backoff_limit: Mapped[int] = mapped_column(Integer, default=0)
    # Seconds between SIGTERM and SIGKILL when the workload is stopped or preempted.
    grace_period: Mapped[float] = mapped_column(Float, default=DEFAULT_GRACE_PERIOD)
    # Declared ports, [{"name": ..., "base_url": bool}]; NULL before 0006_ws.
    ports: Mapped[list[Any] | None] = mapped_column(JSON, default=list)
    # What it brings to its node (0021_travel; NULL: nothing): the digest of a code
    # snapshot of its project, the Python environment to build ({"files": [[name, text],
    # ...], "version", "index_url", "find_links"}) and an OCI image.
    code: Mapped[str | None] = mapped_column(String(71), nullable=True)
    python: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    image: Mapped[str | None] = mapped_column(Text, nullable=True)
    # When the proxy last carried traffic to it (idle detection of workspaces).
    active_at: Mapped[float | None] = mapped_column(Float)
    # pending | running | succeeded | failed | suspended | cancelled
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Failed runs, counted against backoff_limit; preemptions do not count.
    failures: Mapped[int] = mapped_column(Integer, default=0)
    # Bindings so far, counting an elastic workload's growth (which keeps its attempt):
    # each placement's `launch` is this count when it was bound.
    launches: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    # Job history and lifecycle (0006_life): the exit code of the run that ended it, and
    # who cancelled it.
    exit_code: Mapped[int | None] = mapped_column(Integer)
    cancelled_by: Mapped[str | None] = mapped_column(String(NAME))
    # Arrays: the array's name, this member's index, how many members may run at once.
    array_name: Mapped[str | None] = mapped_column(String(KEY))
    array_index: Mapped[int | None] = mapped_column(Integer)
    array_limit: Mapped[int | None] = mapped_column(Integer)
    # Dependencies, as [[name, "ok" | "any"], ...]; `held` while one is not met yet, which
    # keeps the workload out of the scheduler's snapshot.
    after: Mapped[list[Any] | None] = mapped_column(JSON)
    kill_on_invalid_dep: Mapped[bool] = mapped_column(Boolean, default=False)
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    # When it last went back to pending (requeued, retried, resumed); NULL: it has been
    # pending since it was submitted, if it is pending.
    pending_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Checkpoints (0011_ckpt): the newest checkpoint its agents reported (NULL: none), and
    # what its latest preemption threw away: when, how many GPU-seconds of work, counted
    # from when (`lost_since`), and whether that was a checkpoint or the start of its run.
    checkpoint_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    preempted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    lost_gpu_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    lost_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    lost_since_checkpoint: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # A task ended by itself with a non-zero code while another task of the workload ran
    # on a node not heard from since (0017_failing): when, and what ended. Whether that is
    # the workload's failure waits until that node answers or is declared lost.
    failing_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    failing_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Its directories (logs, run files, its own directory) are named by its name alone, as
    # those of a workload submitted before 0018_past; else NAME.ID (see
    # corral.model.spec.directory_name).
    dirs_by_name: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false(), nullable=False
    )

    queue: Mapped[QueueRow] = relationship()
    task_groups: Mapped[list[TaskGroupRow]] = relationship(
        back_populates="workload", cascade="all, delete-orphan", order_by="TaskGroupRow.ordinal"
    )
    placements: Mapped[list[PlacementRow]] = relationship(
        back_populates="workload", cascade="all, delete-orphan", order_by="PlacementRow.task"
    )


class TaskGroupRow(Base):
    __tablename__ = "task_groups"
    __table_args__ = (UniqueConstraint("workload_id", "ordinal"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(NAME))
    replicas: Mapped[int] = mapped_column(Integer)
    gpu: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_memory: Mapped[int] = mapped_column(BigInteger, default=0)
    cpu: Mapped[float] = mapped_column(Float, default=0.0)
    memory: Mapped[int] = mapped_column(BigInteger, default=0)

    workload: Mapped[WorkloadRow] = relationship(back_populates="task_groups")


class PlacementRow(Base):
    """Where one task of a running workload is bound: written before any agent acts."""

    __tablename__ = "placements"
    # By node: a node's record, its removal (and the foreign key's check when its row is
    # deleted) and the reconciler's work of some nodes read the placements of one node.
    __table_args__ = (
        UniqueConstraint("workload_id", "task"),
        Index("ix_placements_node", "node_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    task: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    devices: Mapped[list[Any]] = mapped_column(JSON, default=list)
    gpu: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float)
    # bound (decided, not started yet) | running | exited (with its exit_code: 0, gang not
    # done; or another, while the gang's verdict waits: see WorkloadRow.failing_since)
    state: Mapped[str] = mapped_column(String(16), default="bound")
    # The task's process: pid and start time identify it across restarts.
    pid: Mapped[int | None] = mapped_column(Integer)
    proc_start: Mapped[int | None] = mapped_column(BigInteger)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    # Which binding of the task this is (`WorkloadRow.launches`), sent with its launch and
    # echoed by its process's end: the end of a task stopped earlier is not this one's.
    # NULL for placements from before 0006.
    launch: Mapped[int | None] = mapped_column(Integer)
    # Port name -> number on its node, as the agent reported them (task_ports).
    ports: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # While bound and not started: what its agent prepares for it, as it last said
    # ("building environment: 7 of 12 packages"); NULL otherwise (0021_travel).
    preparing: Mapped[str | None] = mapped_column(Text, nullable=True)

    workload: Mapped[WorkloadRow] = relationship(back_populates="placements")
    node: Mapped[NodeRow] = relationship()


class EventRow(Base):
    """Every state change, with its time, cause and reason. Kept after a workload is gone
    (never deleted): a workload's events are read by its id, so that a later workload of
    the same name does not inherit them, and on SQLite, which would give the id of the
    newest workload again once it is deleted, new ids start above every id here."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_workload_id", "workload_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[float] = mapped_column(Float)
    # The workload's key and id (no foreign key: the event outlives the workload).
    workload: Mapped[str | None] = mapped_column(String(KEY))
    workload_id: Mapped[int | None] = mapped_column(Integer)
    # The attempt (run) of the workload the event belongs to: set on the events of a
    # workload that runs, from the `bound` that starts a run to the event that ends it
    # (0018_past); NULL on the others.
    attempt: Mapped[int | None] = mapped_column(Integer)
    node: Mapped[str | None] = mapped_column(String(NAME))
    kind: Mapped[str] = mapped_column(String(32))
    cause: Mapped[str] = mapped_column(String(NAME))
    reason: Mapped[str] = mapped_column(Text, default="")


class UserRow(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    # admin | member | viewer; a member's projects are its memberships. (The column
    # users.project_id of 0001 is left in the database, unused: see 0003_memberships.)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    # The Unix account this user's tasks run as on a root agent; None: it has none.
    unix_user: Mapped[str | None] = mapped_column(String(32), nullable=True)

    memberships: Mapped[list[MembershipRow]] = relationship(
        back_populates="user", cascade="all, delete-orphan", order_by="MembershipRow.id"
    )


class MembershipRow(Base):
    """A member's place in one project: `member` (manages its own workloads there) or
    `project-admin` (manages every workload of the project)."""

    __tablename__ = "memberships"
    __table_args__ = (UniqueConstraint("user_id", "queue_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    queue_id: Mapped[int] = mapped_column(ForeignKey("queues.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))

    user: Mapped[UserRow] = relationship(back_populates="memberships")
    queue: Mapped[QueueRow] = relationship()


class SecretRow(Base):
    """A project's secret: its value is stored encrypted (Fernet), never in clear."""

    __tablename__ = "secrets"
    __table_args__ = (UniqueConstraint("queue_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    queue_id: Mapped[int] = mapped_column(ForeignKey("queues.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(NAME))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[float] = mapped_column(Float)


class TokenRow(Base):
    """An API token; only its SHA-256 digest is stored."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    # What the token is for, as its owner named it (0003_audit adds these four).
    name: Mapped[str | None] = mapped_column(String(NAME))
    expires_at: Mapped[float | None] = mapped_column(Float)
    # A revoked token is kept (its name and times stay listed) but authenticates nobody.
    revoked_at: Mapped[float | None] = mapped_column(Float)
    last_used_at: Mapped[float | None] = mapped_column(Float)

    user: Mapped[UserRow] = relationship()


class AuditRow(Base):
    """One write request as the API answered it, or one session entering a workload's task
    (exec, shell, port-forward: method EXEC or FORWARD, status 101 once it opened). The
    user is kept by name, so that the record outlives the user."""

    __tablename__ = "audit"
    __table_args__ = (Index("ix_audit_at", "at"), Index("ix_audit_user_at", "user", "at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    # None when the request named no valid token (a 401).
    user: Mapped[str | None] = mapped_column(String(NAME))
    method: Mapped[str] = mapped_column(String(16))
    # The route's template ("/api/v1/workloads/{name}"), or the path when none matched.
    route: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(String(1024))
    address: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    # A session's (0019_sessions adds these five; NULL for a write request): the workload
    # and task it entered, the command it ran (exec), when it ended and the command's exit
    # code (NULL while it runs, and when it ended otherwise: its client left, its user
    # lost access, the server stopped).
    workload: Mapped[str | None] = mapped_column(String(KEY))
    task: Mapped[int | None] = mapped_column(Integer)
    command: Mapped[list[str] | None] = mapped_column(JSON)
    ended_at: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)


class IdempotencyRow(Base):
    """An `Idempotency-Key` a user sent with a submission, the digest of the body it came
    with, and the workloads that request created (written in the same transaction)."""

    __tablename__ = "idempotency"
    __table_args__ = (UniqueConstraint("user", "key"), Index("ix_idempotency_at", "created_at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user: Mapped[str] = mapped_column(String(NAME))
    key: Mapped[str] = mapped_column(String(255))
    digest: Mapped[str] = mapped_column(String(64))
    workloads: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)


class QueueUsageRow(Base):
    """A queue's decayed usage (time-decayed fair share, `corral.model.usage`): the
    GPU-seconds its work held and the GPU-seconds all work held, both decayed with the
    queue's half-life, as of `updated_at`. Kept by the scheduler loop."""

    __tablename__ = "queue_usage"

    queue_id: Mapped[int] = mapped_column(
        ForeignKey("queues.id", ondelete="CASCADE"), primary_key=True
    )
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cluster_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[float] = mapped_column(Float)


class ChangeRow(Base):
    """A committed change that scheduling depends on (`Database.bump`): its number, the
    store's generation once it committed, and the names of the only workloads it touched
    (None: it may have touched anything). The newest `database.JOURNAL` are kept."""

    __tablename__ = "changes"

    generation: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    touched: Mapped[list[str] | None] = mapped_column(JSON)
