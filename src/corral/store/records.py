"""What the store hands out: plain values, never ORM rows."""

from __future__ import annotations

from dataclasses import dataclass

from corral.model import Node, Placement, Queue
from corral.model.spec import Device, WorkloadSpec, directory_name

ACTIVE = ("pending", "running")
FINISHED = ("succeeded", "failed", "cancelled")
STATUSES = ("pending", "running", "suspended", "succeeded", "failed", "cancelled")
ROLES = ("admin", "member", "viewer")
# A member's role in one of its projects.
PROJECT_ROLES = ("member", "project-admin")


@dataclass(frozen=True, slots=True)
class QueueRecord:
    queue: Queue
    children: tuple[str, ...]
    created_at: float

    @property
    def department(self) -> bool:
        return bool(self.children)


@dataclass(frozen=True, slots=True)
class TaskOnNode:
    workload: str
    project: str
    task: int
    devices: tuple[int, ...]
    gpu: float


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node: Node
    devices: tuple[Device, ...]
    virtual: bool
    state: str
    registered_at: float
    heartbeat_at: float | None
    tasks: tuple[TaskOnNode, ...]
    address: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class LostWork:
    """What a workload's latest preemption threw away: `gpu_seconds` of work done since
    `since`, which was its last checkpoint (`from_checkpoint`) or else the start of the
    run that was preempted at `at`. A checkpoint taken in the grace period makes `since`
    later than `at`, and `gpu_seconds` 0."""

    at: float
    gpu_seconds: float
    since: float
    from_checkpoint: bool


@dataclass(frozen=True, slots=True)
class WorkloadRecord:
    id: int
    spec: WorkloadSpec
    status: str
    reason: str | None
    attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    placements: tuple[Placement, ...]
    # Runs that ended in its own failure: only these count against its backoff_limit.
    failures: int = 0
    # Its directories are named by its name alone (a workload of before 0018_past).
    dirs_by_name: bool = False
    # The exit code of the run that ended it (None while it runs, or when unknown), and
    # who cancelled it.
    exit_code: int | None = None
    cancelled_by: str | None = None
    # When it last went back to pending; None: since its submission (see `waiting_since`).
    pending_since: float | None = None
    # The newest checkpoint its agents reported (None: none known), and what its latest
    # preemption lost (None: never preempted, or before corral kept count).
    checkpoint_at: float | None = None
    lost_work: LostWork | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def directory(self) -> str:
        """The name of its own directories: its logs, run files and workload directory."""
        return directory_name(self.name, None if self.dirs_by_name else self.id)

    @property
    def waiting_since(self) -> float:
        """When it last became pending: its submission, or its latest requeue."""
        return self.pending_since if self.pending_since is not None else self.created_at


@dataclass(frozen=True, slots=True)
class ClusterCounts:
    """Totals over the whole cluster, counted by the database."""

    nodes: int
    nodes_ready: int
    gpus: int
    virtual_gpus: int
    gpus_allocated: float
    workloads: dict[str, int]
    queues: int


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the monitor reads of a node every pass: whether its agent is heard from."""

    name: str
    state: str
    heartbeat_at: float | None


@dataclass(frozen=True, slots=True)
class EventRecord:
    id: int
    time: float
    workload: str | None
    node: str | None
    kind: str
    cause: str
    reason: str
    # The attempt (run) of the workload it belongs to; None outside a run.
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A user: `role` is global (admin, viewer or member); a member's rights come from
    `memberships`, (project, role in it) pairs, oldest first."""

    name: str
    role: str
    memberships: tuple[tuple[str, str], ...] = ()
    unix_user: str | None = None

    @property
    def project(self) -> str | None:
        """The first project (what `role` + `project` meant before memberships)."""
        return self.memberships[0][0] if self.memberships else None

    @property
    def projects(self) -> frozenset[str]:
        """Every project the user belongs to."""
        return frozenset(project for project, _ in self.memberships)

    def role_in(self, project: str) -> str | None:
        """The user's role in `project`, or None when not a member of it."""
        return next((role for name, role in self.memberships if name == project), None)

    @property
    def reads_all(self) -> bool:
        """Admins and viewers read every project; members only their own."""
        return self.role in ("admin", "viewer")


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What is shown of a token: never its value nor its digest."""

    id: int
    user: str
    name: str | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None


@dataclass(frozen=True, slots=True)
class TaskState:
    """One bound task as agents need it: where, on which devices, and its process."""

    task: int
    node: str
    address: str
    devices: tuple[int, ...]
    gpu: float
    device_memory: int
    state: str
    pid: int | None
    proc_start: int | None
    # Which binding of the task this is (see `PlacementRow.launch`); None from before 0006.
    launch: int | None = None


@dataclass(frozen=True, slots=True)
class BoundWork:
    """A running workload with every one of its bound tasks."""

    workload: WorkloadRecord
    tasks: tuple[TaskState, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """Tasks whose processes must stop because the store no longer places them."""

    workload: str
    node: str
    tasks: tuple[int, ...]
    reason: str
    # When the change that released them began (see corral.messages).
    decided_at: float | None = None
