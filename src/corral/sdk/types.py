"""The JSON bodies the corral API answers with, as typed dictionaries.

Generated from the server's OpenAPI document by `python -m corral.server.typegen`: do not
edit by hand. Users' code (and the CLI, which prints them with --json) gets the API's JSON
unchanged but typed. Every field is present in an answer, defaults included.
"""

from __future__ import annotations

from typing import Literal, TypedDict

WorkloadStatus = Literal["pending", "running", "suspended", "succeeded", "failed", "cancelled"]
Role = Literal["admin", "member", "viewer"]


class Amounts(TypedDict):
    """Resource amounts in a response; null means unlimited or not managed."""

    gpu: float | None
    cpu: float | None
    memory: int | None


class ArrayOut(TypedDict):
    name: str
    index: int
    # members that may run at once; null: any number
    limit: int | None


class AuditOut(TypedDict):
    """A write request: who (null for no valid token), when, what, from where, outcome. Or a session
    that entered (or tried to enter) a workload's task: method EXEC (exec, shell) or FORWARD
    (port-forward), status 101 once it opened, with the fields below."""

    id: int
    at: float
    user: str | None
    method: str
    route: str
    path: str
    address: str | None
    status: int
    # a session's workload; null for a write
    workload: str | None
    # a session's task
    task: int | None
    # an exec session's command
    command: list[str] | None
    # when a session ended; null while open
    ended_at: float | None
    # an exec session's exit code; null while it runs, and when it ended otherwise (its client left,
    # its user lost access)
    exit_code: int | None


class ClusterOut(TypedDict):
    nodes: int
    nodes_ready: int
    gpus: int
    gpus_allocated: float
    gpus_free: float
    virtual_gpus: int
    workloads: dict[str, int]
    queues: int
    last_cycle_at: float | None
    last_cycle_seconds: float | None


class ClusterPoint(TypedDict):
    # start of the step, seconds since the epoch
    time: float
    # GPUs registered now
    gpus: int
    # GPUs held by tasks, on average over the step
    allocated: float
    # GPUs' worth of compute used, on average over the step
    used: float


class ClusterSeriesOut(TypedDict):
    since: float
    until: float
    step: float
    series: list[ClusterPoint]


class DeviceOut(TypedDict):
    index: int
    uuid: str
    model: str
    memory: int
    virtual: bool


class DeviceTelemetryOut(TypedDict):
    node: str
    device: int
    model: str
    virtual: bool
    # percent of the device; null: no sample
    utilization: float | None
    memory_used: int | None
    memory_total: int
    # watts
    power: float | None
    # degrees Celsius
    temperature: float | None
    source: Literal["nvml", "declared", "none"]
    # workloads holding the device now, as PROJECT/NAME (of the caller's projects only, for a
    # member)
    workloads: list[str]
    # free: nobody holds it; idle: held, latest samples at 0%; busy: held
    state: Literal["free", "busy", "idle"]


class EventOut(TypedDict):
    id: int
    time: float
    workload: str | None
    node: str | None
    kind: str
    cause: str
    reason: str
    # the workload's attempt (run) the event belongs to, from the `bound` that starts it to the
    # event that ends it; null outside a run
    attempt: int | None


class HistoryOut(TypedDict):
    """A workload as history shows it (like a line of sacct)."""

    name: str
    project: str
    user: str
    state: str
    priority: int
    # GPUs asked for: whole devices and fractions, all tasks
    gpus: float
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    # from submission to first start (so far)
    wait_seconds: float | None
    # from first start to the end (so far)
    run_seconds: float | None
    # GPUs held times hours held, every run
    gpu_hours: float
    exit_code: int | None
    attempts: int
    evictions: int
    reason: str | None
    cancelled_by: str | None
    array: str | None
    array_index: int | None


class HolderOut(TypedDict):
    # null for another project's workload, whose name a member may not read
    workload: str | None
    project: str
    priority: int
    preemptible: bool
    node: str
    gpu: float
    # for a pending workload: `reclaim` or `preempt` when the scheduler may take these GPUs for it,
    # else `no: ` and why not
    may_take: str | None


class LogOut(TypedDict):
    workload: str
    task: int
    text: str
    # pass it back as `offset` to read only what follows
    offset: int
    # tasks that have logs
    tasks: list[int]


class LostWorkOut(TypedDict):
    # when the workload was preempted
    at: float
    # GPU-seconds of work done since `since`, lost
    gpu_seconds: float
    # its last checkpoint, or the start of the run preempted; after `at` when it checkpointed in its
    # grace period (then nothing was lost)
    since: float
    # whether `since` is a checkpoint
    from_checkpoint: bool
    # in words: "lost 12 GPU-min of work: last checkpoint ..."
    summary: str


class MembershipOut(TypedDict):
    project: str
    role: str


class NodeOut(TypedDict):
    name: str
    gpus: int
    gpu_model: str
    gpu_memory: int
    cpu: float
    memory: int
    labels: dict[str, str]
    # its node pool: its `pool` label, or default
    pool: str
    schedulable: bool
    state: str
    virtual: bool
    devices: list[DeviceOut]
    tasks: list[TaskOnNodeOut]
    allocated_gpu: float
    registered_at: float
    heartbeat_at: float | None
    # where the server reaches its tasks (its Ray node's address; loopback for this machine's agent)
    address: str


class PlacementOut(TypedDict):
    task: int
    node: str
    devices: list[int]
    gpu: float


class PortOut(TypedDict):
    name: str
    base_url: bool


class PythonOut(TypedDict):
    # the names of the files that say what to install
    files: list[str]
    version: str | None
    index_url: str | None
    find_links: list[str]


class QueueOut(TypedDict):
    name: str
    parent: str | None
    department: bool
    children: list[str]
    deserved: Amounts
    limit: Amounts
    over_quota_weight: WeightsOut
    priority: int
    # seconds, set on this queue itself (null: inherited or off)
    preempt_min_runtime: float | None
    # seconds, set on this queue itself (null: inherited or off)
    reclaim_min_runtime: float | None
    # seconds, set on this queue itself (null: inherited or off)
    fair_share_half_life: float | None
    # set on this queue itself (null: inherited, or 1)
    fair_share_k: float | None
    # time-decayed fair share, where it is on: the over-quota GPU weight the latest cycle divided
    # the surplus by
    effective_weight: float | None
    # where time-decayed fair share is on: its share of the cluster's decayed GPU-time, 0 to 1
    usage: float | None
    # why the effective weight differs from the over-quota weight
    weight_reason: str | None
    # seconds, set on this queue itself (null: inherited or off)
    reserve_after: float | None
    # from the latest scheduling cycle
    fair_share: Amounts | None
    allocated: Amounts | None
    requested: Amounts | None
    # GPUs asked for by work not yet running
    pending_gpu: float | None
    created_at: float
    # rules set on this queue itself, by workload class
    rules: dict[str, RuleOut]
    # by node pool, while pools are in use: the pools it has quotas in and those the latest cycle
    # divided
    pools: dict[str, QueuePoolOut]


class QueuePoint(TypedDict):
    time: float
    allocated: float
    used: float
    # the queue's deserved GPUs now
    deserved: float


class QueuePoolOut(TypedDict):
    """A queue in one node pool: its quota there and, after a cycle, its share of it."""

    deserved: Amounts
    limit: Amounts
    # the queue gives a quota for this pool itself (else: its deserved and limit in the default
    # pool, none in another)
    own_quota: bool
    fair_share: Amounts | None
    allocated: Amounts | None


class QueueSeriesOut(TypedDict):
    since: float
    until: float
    step: float
    # by queue: projects and departments
    series: dict[str, list[QueuePoint]]


class RuleOut(TypedDict):
    # seconds; null: no limit
    idle_timeout: float | None
    # seconds; null: no limit
    max_runtime: float | None


class SecretOut(TypedDict):
    name: str
    updated_at: float


class StartOut(TypedDict):
    workload: str
    project: str
    # seconds since the epoch; null when it cannot be known
    estimated_start: float | None
    # what the estimate rests on
    why: str


class TaskGroupOut(TypedDict):
    name: str
    replicas: int
    gpu: float
    gpu_memory: int
    cpu: float
    memory: int


class TaskOnNodeOut(TypedDict):
    # null for another project's workload, whose name a member may not read
    workload: str | None
    project: str
    task: int
    devices: list[int]
    gpu: float


class TokenInfoOut(TypedDict):
    """A token as listed: never its value."""

    id: int
    user: str
    name: str | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    # exact to about 10 s
    last_used_at: float | None
    # neither revoked nor expired
    active: bool


class TokenOut(TypedDict):
    user: str
    # shown once; only its digest is stored
    token: str
    # for `DELETE /tokens/{id}`
    id: int | None
    name: str | None
    expires_at: float | None


class TopologyOut(TypedDict):
    key: str
    required: bool


class UsageRowOut(TypedDict):
    key: str
    gpu_hours_allocated: float
    gpu_hours_used: float
    gpu_hours_idle: float


class UserOut(TypedDict):
    name: str
    role: str
    # the first of `projects`, or null
    project: str | None
    # a member's projects and role in each
    projects: list[MembershipOut]
    # the Unix account its tasks run as
    unix_user: str | None


class WeightsOut(TypedDict):
    gpu: float
    cpu: float
    memory: float


class WhyOut(TypedDict):
    workload: str
    status: str
    reason: str | None
    # 1 for the next in its project to be tried
    position: int | None
    # pending workloads of its project tried before it
    ahead: list[str]
    # running work on the nodes it may use
    holders: list[HolderOut]
    # GPUs it needs at once (an elastic one's minimum)
    needs: float
    # its project and the departments above it
    queues: list[WhyQueueOut]
    # whether its project may take GPUs back from others, and what from
    reclaim: str | None
    # whether lower-priority work of its own project may be preempted
    preempt: str | None


class WhyQueueOut(TypedDict):
    """A queue on the workload's path (its project, then each department), in GPUs as the latest
    scheduling cycle saw them."""

    name: str
    deserved: float
    # null: no limit
    limit: float | None
    # null before the first cycle
    fair_share: float | None
    # null before the first cycle
    allocated: float | None
    # time-decayed fair share, where it is on: the over-quota GPU weight
    effective_weight: float | None
    # why the weight is what it is
    weight_reason: str | None


class WorkloadOut(TypedDict):
    name: str
    # never given to another workload, even one that takes this name once this one is deleted
    id: int
    # the name of its own directories: its logs (DATA_DIR/logs/DIRECTORY on the server), its
    # workload directory with its checkpoints (WORKLOADS_DIR/DIRECTORY on its node): NAME.ID, so
    # that a later workload of the same name starts with none of them (NAME alone for a workload
    # submitted before corral named them so)
    directory: str
    project: str
    user: str
    status: WorkloadStatus
    reason: str | None
    priority: int
    preemptible: bool
    tasks: list[TaskGroupOut]
    min_available: int | None
    node_selector: dict[str, list[str]]
    node_pools: list[str]
    topology: TopologyOut | None
    command: list[str]
    env: dict[str, str]
    # environment variable -> secret name
    secrets: dict[str, str]
    workdir: str | None
    # the digest of its code snapshot
    code: str | None
    python: PythonOut | None
    image: str | None
    max_runtime: float | None
    backoff_limit: int
    grace_period: float
    # runs started: retries, requeues and preemptions included
    attempts: int
    # runs that ended in its own failure (a task's non-zero exit, a maximum runtime): only these
    # count against backoff_limit, not requeues or preemptions
    failures: int
    created_at: float
    started_at: float | None
    # for a pending workload, when it last became pending: its submission, or its latest requeue,
    # retry or resume
    pending_since: float | None
    finished_at: float | None
    placements: list[PlacementOut]
    # of the run that ended it
    exit_code: int | None
    cancelled_by: str | None
    # the array it belongs to, if any
    array: ArrayOut | None
    # "NAME:ok" or "NAME:any"
    after: list[str]
    kill_on_invalid_dep: bool
    # its declared ports
    ports: list[PortOut]
    # the newest checkpoint its agents reported; null: none known
    checkpoint_at: float | None
    # what its latest preemption threw away; null: never preempted
    lost_work: LostWorkOut | None


class WorkloadPoint(TypedDict):
    # of the sample; of its bucket's start for rollups
    time: float
    node: str
    device: int
    task: int | None
    # percent of the task's share of the device
    utilization: float
    memory_used: int
    # nvml: measured; declared: what the task reported (virtual devices)
    source: Literal["nvml", "declared", "none"]


class WorkloadSeriesOut(TypedDict):
    workload: str
    series: list[WorkloadPoint]


class WorkspaceOut(TypedDict):
    name: str
    project: str
    user: str
    status: WorkloadStatus
    node: str | None
    ports: list[WorkspacePortOut]
    # when the proxy last carried its traffic
    active_at: float | None
    # seconds since its last proxied traffic (or its start), while running
    idle_seconds: float | None


class WorkspacePortOut(TypedDict):
    name: str
    # where the proxy serves it on this server
    path: str
    # its agent has reported the port's number
    ready: bool
