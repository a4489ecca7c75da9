"""Request and response bodies of the REST API, validated by Pydantic.

Validation happens here, so that a bad request is answered with 422 naming each bad field
before anything is written. Conversions to the model's plain data live beside the bodies.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.api.rules import RuleOut, RulesIn
from corral.control.accounts import is_root_account
from corral.model import (
    DEFAULT_GRACE_PERIOD,
    DEFAULT_POOL,
    Node,
    PoolQuota,
    Queue,
    Resources,
    TaskGroup,
    Topology,
    default_preemptible,
    parse_memory,
    resolve_priority,
)
from corral.model.arrays import parse_array, parse_dependency
from corral.model.durations import parse_duration
from corral.model.spec import Device, NodeSpec, PortSpec, WorkloadSpec
from corral.spec.limits import (
    MAX_REPLICAS,
    MAX_TASK_GROUPS,
    gpu_problem,
    tasks_problem,
)
from corral.store.records import UserRecord

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Name = Annotated[str, Field(pattern=NAME_PATTERN, min_length=1, max_length=63)]
ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# A dependency: a workload's name, then ":ok" (it succeeded, the default) or ":any" (ended).
AFTER_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(:(ok|any))?$"
# A secret is named as the environment variable it becomes by default.
SecretName = Annotated[str, Field(pattern=ENV_PATTERN, min_length=1, max_length=63)]
LabelKey = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$", max_length=63)
]
LabelValue = Annotated[str, Field(max_length=63)]
# A node pool: the value of a node's `pool` label.
PoolName = Annotated[str, Field(min_length=1, max_length=63)]
Memory = Annotated[int | str, Field(description='bytes, or a binary unit: "512MiB", "80GiB"')]
# Amounts are bounded so that arithmetic never overflows and JSON stays finite.
Amount = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]


def _seconds(value: float | str) -> float:
    # parse_duration's ValueError says what was wrong; pydantic names the field.
    return parse_duration(value)


# A min-runtime: seconds, or a duration such as "10m"; answered in seconds.
MinRuntime = Annotated[
    float | str,
    Field(description='seconds, or a duration: "90s", "10m", "4h"'),
    AfterValidator(_seconds),
]
MAX_MEMORY = 1 << 60
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


# The most workloads one batch submission may carry.
BATCH_LIMIT = 1000


class Body(BaseModel):
    # Strict: `"virtual": 0` or `"grace_period": false` are mistakes to report, not values
    # to coerce (JSON integers still count as numbers where a float is expected).
    model_config = ConfigDict(extra="forbid", strict=True)


def _os_string(value: str) -> str:
    """A string the kernel can take in argv, the environment or a path: no NUL byte."""
    if "\0" in value:
        raise ValueError("must not contain a NUL byte")
    return value


# Strings that become a task's argv, environment or working directory.
OsString = Annotated[str, AfterValidator(_os_string)]
Argument = Annotated[OsString, Field(max_length=65536)]
# A Unix login name as useradd accepts it (POSIX portable, at most 32 bytes).
UnixUser = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]*\$?$", min_length=1, max_length=32)]


def memory_bytes(value: int | str) -> int:
    """Memory in bytes; raises ValueError with a readable message."""
    amount = parse_memory(value)
    if amount > MAX_MEMORY:
        raise ValueError(f"{value!r} is more than 1 EiB")
    return amount


def duration_seconds(value: float | str) -> float:
    """Seconds from 3600, "90m", "4h" or "2d"."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a duration (for example 90m, 4h, 2d)")
        seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    if not (0 < seconds <= 365 * 86400):
        raise ValueError("must be more than 0 and at most a year")
    return seconds


# Time-decayed fair share's usage factor k: how strongly usage moves a queue's weight.
UsageFactor = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]


# -- queues ---------------------------------------------------------------------------------


class Quota(Body):
    """An amount of each resource. CPU and memory left out are not managed (deserved)
    or not limited (limit); GPUs left out are 0 (deserved) or unlimited (limit)."""

    gpu: Amount | None = None
    cpu: Amount | None = None
    memory: Memory | None = None

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            memory_bytes(value)
        return value

    def resources(self, gpu_default: float) -> Resources:
        return Resources(
            gpu_default if self.gpu is None else self.gpu,
            math.inf if self.cpu is None else self.cpu,
            math.inf if self.memory is None else float(memory_bytes(self.memory)),
        )


class Weights(Body):
    gpu: Amount = 1.0
    cpu: Amount = 1.0
    memory: Amount = 1.0


def _quota(value: Quota | float | None, gpu_default: float) -> Resources:
    if value is None:
        return Resources(gpu_default, math.inf, math.inf)
    if isinstance(value, Quota):
        return value.resources(gpu_default)
    return Resources(float(value), math.inf, math.inf)


def _weights(value: Weights | float) -> Resources:
    if isinstance(value, Weights):
        return Resources(value.gpu, value.cpu, value.memory)
    return Resources(float(value), float(value), float(value))


class PoolQuotaIn(Body):
    """A queue's quota in one node pool: GPUs, or a map of gpu, cpu and memory."""

    deserved: Quota | Amount = 0.0
    limit: Quota | Amount | None = None

    def to_model(self) -> PoolQuota:
        return PoolQuota(_quota(self.deserved, 0.0), _quota(self.limit, math.inf))


def _check_pools(value: dict[str, PoolQuotaIn]) -> dict[str, PoolQuotaIn]:
    if DEFAULT_POOL in value:
        raise ValueError(
            f"{DEFAULT_POOL}: the default pool's quota is the queue's own deserved and limit"
        )
    return value


PoolQuotas = Annotated[
    dict[PoolName, PoolQuotaIn],
    Field(
        max_length=64,
        description="deserved and limit by node pool; the queue's own deserved and limit "
        "are its quota in the default pool",
    ),
    AfterValidator(_check_pools),
]


def _pool_models(value: dict[str, PoolQuotaIn] | None) -> dict[str, PoolQuota]:
    return {pool: quota.to_model() for pool, quota in (value or {}).items()}


class QueueIn(Body):
    name: Name
    parent: Name | None = None
    deserved: Quota | Amount = 0.0
    limit: Quota | Amount | None = None
    over_quota_weight: Weights | Amount = 1.0
    priority: int = Field(100, ge=-1_000_000, le=1_000_000)
    preempt_min_runtime: MinRuntime | None = Field(
        None, description="work that has run for less is no victim of preemption; null inherits"
    )
    reclaim_min_runtime: MinRuntime | None = Field(
        None, description="work that has run for less is no victim of reclaim; null inherits"
    )
    fair_share_half_life: MinRuntime | None = Field(
        None,
        description="time-decayed fair share: the half-life of its usage history; null inherits"
        " (none up the tree: off)",
    )
    fair_share_k: UsageFactor | None = Field(
        None, description="time-decayed fair share: usage factor k; null inherits (default 1)"
    )
    reserve_after: MinRuntime | None = Field(
        None,
        description="a workload that waits this long at the head of the queue gets a "
        "reservation (backfill); null inherits",
    )
    rules: RulesIn | None = Field(None, description="rules that act on utilisation, by class")
    pools: PoolQuotas = Field(default_factory=dict)

    def to_model(self) -> Queue:
        return Queue(
            name=self.name,
            parent=self.parent,
            deserved=_quota(self.deserved, 0.0),
            limit=_quota(self.limit, math.inf),
            over_quota_weight=_weights(self.over_quota_weight),
            priority=self.priority,
            preempt_min_runtime=_optional_seconds(self.preempt_min_runtime),
            reclaim_min_runtime=_optional_seconds(self.reclaim_min_runtime),
            fair_share_half_life=_optional_seconds(self.fair_share_half_life),
            fair_share_k=self.fair_share_k,
            pools=_pool_models(self.pools),
            reserve_after=_optional_seconds(self.reserve_after),
        )


def _optional_seconds(value: float | str | None) -> float | None:
    # Already validated into seconds by MinRuntime.
    return None if value is None else float(value)


class QueuePatch(Body):
    """Fields to change; a field left out stays as it is. `limit: null` removes the limit."""

    parent: Name | None = None
    deserved: Quota | Amount | None = None
    limit: Quota | Amount | None = None
    over_quota_weight: Weights | Amount | None = None
    priority: int | None = Field(None, ge=-1_000_000, le=1_000_000)
    preempt_min_runtime: MinRuntime | None = Field(None, description="null: inherit again")
    reclaim_min_runtime: MinRuntime | None = Field(None, description="null: inherit again")
    fair_share_half_life: MinRuntime | None = Field(None, description="null: inherit again")
    fair_share_k: UsageFactor | None = Field(None, description="null: inherit again")

    reserve_after: MinRuntime | None = Field(None, description="null: inherit again")
    rules: RulesIn | None = Field(None, description="replaces all the queue's rules; null: none")
    pools: PoolQuotas | None = Field(None, description="replaces all its pool quotas; null: none")

    def changes(self) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        given = self.model_fields_set
        if "parent" in given:
            changes["parent"] = self.parent
        if "deserved" in given:
            changes["deserved"] = _quota(self.deserved, 0.0)
        if "limit" in given:
            changes["limit"] = _quota(self.limit, math.inf)
        if "over_quota_weight" in given and self.over_quota_weight is not None:
            changes["over_quota_weight"] = _weights(self.over_quota_weight)
        if "priority" in given and self.priority is not None:
            changes["priority"] = self.priority
        for field in (
            "preempt_min_runtime",
            "reclaim_min_runtime",
            "fair_share_half_life",
            "reserve_after",
        ):
            if field in given:
                changes[field] = _optional_seconds(getattr(self, field))
        if "fair_share_k" in given:
            changes["fair_share_k"] = self.fair_share_k

        if "pools" in given:
            changes["pools"] = _pool_models(self.pools)
        return changes


class Amounts(BaseModel):
    """Resource amounts in a response; null means unlimited or not managed."""

    gpu: float | None
    cpu: float | None
    memory: int | None

    @classmethod
    def of(cls, resources: Resources) -> Amounts:
        return cls(
            gpu=None if math.isinf(resources.gpu) else resources.gpu,
            cpu=None if math.isinf(resources.cpu) else resources.cpu,
            memory=None if math.isinf(resources.memory) else int(resources.memory),
        )


class WeightsOut(BaseModel):
    gpu: float
    cpu: float
    memory: float

    @classmethod
    def of(cls, weights: Resources) -> WeightsOut:
        return cls(gpu=weights.gpu, cpu=weights.cpu, memory=weights.memory)


class QueuePoolOut(BaseModel):
    """A queue in one node pool: its quota there and, after a cycle, its share of it."""

    deserved: Amounts
    limit: Amounts
    own_quota: bool = Field(
        description="the queue gives a quota for this pool itself (else: its deserved and "
        "limit in the default pool, none in another)"
    )
    fair_share: Amounts | None
    allocated: Amounts | None


class QueueOut(BaseModel):
    name: str
    parent: str | None
    department: bool
    children: list[str]
    deserved: Amounts
    limit: Amounts
    over_quota_weight: WeightsOut
    priority: int
    preempt_min_runtime: float | None = Field(
        None, description="seconds, set on this queue itself (null: inherited or off)"
    )
    reclaim_min_runtime: float | None = Field(
        None, description="seconds, set on this queue itself (null: inherited or off)"
    )
    fair_share_half_life: float | None = Field(
        None, description="seconds, set on this queue itself (null: inherited or off)"
    )
    fair_share_k: float | None = Field(
        None, description="set on this queue itself (null: inherited, or 1)"
    )
    effective_weight: float | None = Field(
        None,
        description="time-decayed fair share, where it is on: the over-quota GPU weight the"
        " latest cycle divided the surplus by",
    )
    usage: float | None = Field(
        None,
        description="where time-decayed fair share is on: its share of the cluster's"
        " decayed GPU-time, 0 to 1",
    )
    weight_reason: str | None = Field(
        None, description="why the effective weight differs from the over-quota weight"
    )

    reserve_after: float | None = Field(
        None, description="seconds, set on this queue itself (null: inherited or off)"
    )
    fair_share: Amounts | None = Field(description="from the latest scheduling cycle")
    allocated: Amounts | None
    requested: Amounts | None
    pending_gpu: float | None = Field(description="GPUs asked for by work not yet running")
    created_at: float
    rules: dict[str, RuleOut] = Field(
        default_factory=dict, description="rules set on this queue itself, by workload class"
    )
    pools: dict[str, QueuePoolOut] = Field(
        default_factory=dict,
        description="by node pool, while pools are in use: the pools it has quotas in and "
        "those the latest cycle divided",
    )


# -- workloads ------------------------------------------------------------------------------


class TaskGroupIn(Body):
    name: Name = "worker"
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    gpu: Amount = 0.0
    gpu_memory: Memory | None = None
    cpu: Amount = 0.0
    memory: Memory = 0

    @field_validator("gpu")
    @classmethod
    def _whole_or_fraction(cls, value: float) -> float:
        problem = gpu_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("gpu_memory", "memory")
    @classmethod
    def _memory(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            memory_bytes(value)
        return value

    @model_validator(mode="after")
    def _one_kind_of_fraction(self) -> TaskGroupIn:
        if self.gpu_memory is not None and self.gpu > 0:
            raise ValueError("give gpu or gpu_memory, not both")
        if self.gpu_memory is not None and memory_bytes(self.gpu_memory) == 0:
            raise ValueError("gpu_memory must be more than 0")
        return self

    def to_model(self) -> TaskGroup:
        return TaskGroup(
            name=self.name,
            replicas=self.replicas,
            gpu=self.gpu,
            gpu_memory=memory_bytes(self.gpu_memory) if self.gpu_memory is not None else 0,
            cpu=self.cpu,
            memory=memory_bytes(self.memory),
        )


class TopologyIn(Body):
    key: LabelKey
    required: bool = True


PORT_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class PortIn(Body):
    """A port the workload's task listens on (a workspace's), reached at /w/NAME/ for
    `main` and at /w/NAME/PORT/ for the others."""

    name: Annotated[str, Field(pattern=PORT_PATTERN, min_length=1, max_length=31)] = "main"
    base_url: bool = Field(
        False,
        description="the program serves under CORRAL_BASE_URL itself (Jupyter's base_url): "
        "the proxy passes the full path instead of stripping /w/NAME/",
    )


class PortOut(BaseModel):
    name: str
    base_url: bool


class WorkloadIn(Body):
    name: Name | None = Field(None, description="generated from the project when left out")
    project: Name
    tasks: list[TaskGroupIn] = Field(min_length=1, max_length=MAX_TASK_GROUPS)
    priority: str | int = "train"
    preemptible: bool | None = Field(None, description="default: true below priority 100")
    min_available: int | None = Field(None, ge=1)
    node_selector: dict[LabelKey, LabelValue | list[LabelValue]] = Field(
        default_factory=dict, max_length=32
    )
    topology: TopologyIn | None = None
    node_pools: list[PoolName] = Field(
        default_factory=list,
        max_length=16,
        description="node pools it may run in, in order of preference; empty: any pool",
    )
    command: list[Argument] = Field(default_factory=list, max_length=4096)
    # Names are shell identifiers, so never hold "=" or NUL.
    env: dict[Annotated[str, Field(pattern=ENV_PATTERN, max_length=256)], OsString] = Field(
        default_factory=dict, max_length=1024
    )
    secrets: dict[Annotated[str, Field(pattern=ENV_PATTERN, max_length=256)], SecretName] = Field(
        default_factory=dict,
        max_length=256,
        description="environment variable -> name of a secret of the project; the task "
        "gets its value, which no answer, event or log shows",
    )
    workdir: OsString | None = Field(
        None,
        max_length=4096,
        description="default: the workload's own directory; a relative path is taken from it",
    )
    max_runtime: float | str | None = None
    backoff_limit: int = Field(0, ge=0, le=100)
    grace_period: float | str = Field(
        DEFAULT_GRACE_PERIOD,
        description="seconds from SIGTERM to SIGKILL when stopped or preempted",
    )
    array: str | None = Field(
        None,
        max_length=1024,
        description='one workload per index, named NAME-INDEX: "0-99", "1,3,5-7"; "%8" '
        "after it: at most 8 running at once",
    )
    after: list[Annotated[str, Field(pattern=AFTER_PATTERN, max_length=80)]] = Field(
        default_factory=list,
        max_length=64,
        description='workloads to wait for: "NAME" or "NAME:ok" until it succeeded, '
        '"NAME:any" until it ended',
    )
    kill_on_invalid_dep: bool = Field(
        False,
        description="cancel it when a dependency can no longer be met (default: it stays "
        "pending with that reason)",
    )

    @field_validator("array")
    @classmethod
    def _array(cls, value: str | None) -> str | None:
        if value is not None:
            parse_array(value)
        return value

    ports: list[PortIn] = Field(
        default_factory=list,
        max_length=8,
        description="ports its task listens on, proxied by the server (a workspace)",
    )

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[PortIn]) -> list[PortIn]:
        names = [port.name for port in value]
        if len(set(names)) != len(names):
            raise ValueError("port names must differ")
        return value

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: str | int) -> str | int:
        number = resolve_priority(value)
        if abs(number) > 1_000_000:
            raise ValueError("must be between -1000000 and 1000000")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if value and not value[0]:
            raise ValueError("the program to run (the first word) must not be empty")
        return value

    @field_validator("grace_period")
    @classmethod
    def _grace(cls, value: float | str) -> float | str:
        if not isinstance(value, str) and value == 0:
            return value
        duration_seconds(value)
        return value

    @field_validator("max_runtime")
    @classmethod
    def _runtime(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            duration_seconds(value)
        return value

    @field_validator("node_pools")
    @classmethod
    def _node_pools(cls, value: list[str]) -> list[str]:
        twice = sorted({pool for pool in value if value.count(pool) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)}: listed twice")
        return value

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, value: dict[str, str | list[str]]) -> dict[str, str | list[str]]:
        for key, values in value.items():
            if isinstance(values, list) and not values:
                raise ValueError(f"{key}: give at least one value")
        return value

    @model_validator(mode="after")
    def _min_available(self) -> WorkloadIn:
        total = sum(group.replicas for group in self.tasks)
        problem = tasks_problem(total)
        if problem is not None:
            raise ValueError(problem)
        if self.min_available is not None and self.min_available > total:
            raise ValueError(f"min_available {self.min_available} is more than the {total} tasks")
        names = [group.name for group in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError("task group names must differ")
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(f"{', '.join(both)}: in both env and secrets")
        if self.array is not None and self.name is not None:
            longest = f"{self.name}-{parse_array(self.array)[0][-1]}"
            if len(longest) > 63:
                raise ValueError(f"name: the array member {longest!r} is over 63 characters")
        return self

    def to_spec(self, name: str, user: str) -> WorkloadSpec:
        priority = resolve_priority(self.priority)
        return WorkloadSpec(
            name=name,
            project=self.project,
            user=user,
            task_groups=tuple(group.to_model() for group in self.tasks),
            priority=priority,
            preemptible=(
                default_preemptible(priority) if self.preemptible is None else self.preemptible
            ),
            min_available=self.min_available,
            node_selector={
                key: tuple(values) if isinstance(values, list) else (values,)
                for key, values in self.node_selector.items()
            },
            topology=Topology(self.topology.key, self.topology.required) if self.topology else None,
            node_pools=tuple(self.node_pools),
            command=tuple(self.command),
            env=dict(self.env),
            secrets=dict(self.secrets),
            workdir=self.workdir,
            max_runtime=duration_seconds(self.max_runtime)
            if self.max_runtime is not None
            else None,
            backoff_limit=self.backoff_limit,
            grace_period=(0.0 if self.grace_period == 0 else duration_seconds(self.grace_period)),
            after=tuple(parse_dependency(text) for text in dict.fromkeys(self.after)),
            kill_on_invalid_dep=self.kill_on_invalid_dep,
            ports=tuple(PortSpec(port.name, port.base_url) for port in self.ports),
        )


class TaskGroupOut(BaseModel):
    name: str
    replicas: int
    gpu: float
    gpu_memory: int
    cpu: float
    memory: int


class PlacementOut(BaseModel):
    task: int
    node: str
    devices: list[int]
    gpu: float


class TopologyOut(BaseModel):
    key: str
    required: bool


class ArrayOut(BaseModel):
    name: str
    index: int
    limit: int | None = Field(description="members that may run at once; null: any number")


class WorkspacePortOut(BaseModel):
    name: str
    path: str = Field(description="where the proxy serves it on this server")
    ready: bool = Field(description="its agent has reported the port's number")


class WorkspaceOut(BaseModel):
    name: str
    project: str
    user: str
    status: Literal["pending", "running", "suspended", "succeeded", "failed", "cancelled"]
    node: str | None
    ports: list[WorkspacePortOut]
    active_at: float | None = Field(description="when the proxy last carried its traffic")
    idle_seconds: float | None = Field(
        description="seconds since its last proxied traffic (or its start), while running"
    )


class LostWorkOut(BaseModel):
    at: float = Field(description="when the workload was preempted")
    gpu_seconds: float = Field(description="GPU-seconds of work done since `since`, lost")
    since: float = Field(
        description="its last checkpoint, or the start of the run preempted; after `at` when "
        "it checkpointed in its grace period (then nothing was lost)"
    )
    from_checkpoint: bool = Field(description="whether `since` is a checkpoint")
    summary: str = Field(description='in words: "lost 12 GPU-min of work: last checkpoint ..."')


class WorkloadOut(BaseModel):
    name: str
    id: int = Field(
        description="never given to another workload, even one that takes this name once "
        "this one is deleted"
    )
    directory: str = Field(
        description="the name of its own directories: its logs (DATA_DIR/logs/DIRECTORY on "
        "the server), its workload directory with its checkpoints (WORKLOADS_DIR/DIRECTORY "
        "on its node): NAME.ID, so that a later workload of the same name starts with none "
        "of them (NAME alone for a workload submitted before corral named them so)"
    )
    project: str
    user: str
    status: Literal["pending", "running", "suspended", "succeeded", "failed", "cancelled"]
    reason: str | None
    priority: int
    preemptible: bool
    tasks: list[TaskGroupOut]
    min_available: int | None
    node_selector: dict[str, list[str]]
    node_pools: list[str] = Field(default_factory=list)
    topology: TopologyOut | None
    command: list[str]
    env: dict[str, str]
    secrets: dict[str, str] = Field(description="environment variable -> secret name")
    workdir: str | None
    max_runtime: float | None
    backoff_limit: int
    grace_period: float
    attempts: int = Field(description="runs started: retries, requeues and preemptions included")
    failures: int = Field(
        0,
        description="runs that ended in its own failure (a task's non-zero exit, a maximum "
        "runtime): only these count against backoff_limit, not requeues or preemptions",
    )
    created_at: float
    started_at: float | None
    pending_since: float | None = Field(
        None,
        description="for a pending workload, when it last became pending: its submission, "
        "or its latest requeue, retry or resume",
    )
    finished_at: float | None
    placements: list[PlacementOut]
    exit_code: int | None = Field(None, description="of the run that ended it")
    cancelled_by: str | None = None
    array: ArrayOut | None = Field(None, description="the array it belongs to, if any")
    after: list[str] = Field(default_factory=list, description='"NAME:ok" or "NAME:any"')
    kill_on_invalid_dep: bool = False
    ports: list[PortOut] = Field(default_factory=list, description="its declared ports")
    checkpoint_at: float | None = Field(
        None, description="the newest checkpoint its agents reported; null: none known"
    )
    lost_work: LostWorkOut | None = Field(
        None, description="what its latest preemption threw away; null: never preempted"
    )


class EventOut(BaseModel):
    id: int
    time: float
    workload: str | None
    node: str | None
    kind: str
    cause: str
    reason: str
    attempt: int | None = Field(
        None,
        description="the workload's attempt (run) the event belongs to, from the `bound` "
        "that starts it to the event that ends it; null outside a run",
    )


class HolderOut(BaseModel):
    workload: str | None = Field(
        description="null for another project's workload, whose name a member may not read"
    )
    project: str
    priority: int
    preemptible: bool
    node: str
    gpu: float
    may_take: str | None = Field(
        None,
        description="for a pending workload: `reclaim` or `preempt` when the scheduler may "
        "take these GPUs for it, else `no: ` and why not",
    )


class WhyQueueOut(BaseModel):
    """A queue on the workload's path (its project, then each department), in GPUs as the
    latest scheduling cycle saw them."""

    name: str
    deserved: float
    limit: float | None = Field(description="null: no limit")
    fair_share: float | None = Field(description="null before the first cycle")
    allocated: float | None = Field(description="null before the first cycle")
    effective_weight: float | None = Field(
        None, description="time-decayed fair share, where it is on: the over-quota GPU weight"
    )
    weight_reason: str | None = Field(None, description="why the weight is what it is")


class WhyOut(BaseModel):
    workload: str
    status: str
    reason: str | None
    position: int | None = Field(description="1 for the next in its project to be tried")
    ahead: list[str] = Field(description="pending workloads of its project tried before it")
    holders: list[HolderOut] = Field(description="running work on the nodes it may use")
    needs: float = Field(0.0, description="GPUs it needs at once (an elastic one's minimum)")
    queues: list[WhyQueueOut] = Field(
        default_factory=list, description="its project and the departments above it"
    )
    reclaim: str | None = Field(
        None, description="whether its project may take GPUs back from others, and what from"
    )
    preempt: str | None = Field(
        None, description="whether lower-priority work of its own project may be preempted"
    )


# -- nodes ----------------------------------------------------------------------------------


class DeviceIn(Body):
    index: int = Field(ge=0, le=1023)
    uuid: str = Field(min_length=1, max_length=128)
    model: str = Field(min_length=1, max_length=63)
    memory: Memory
    virtual: bool = False


class WorkloadBatchIn(Body):
    """Several workloads submitted together: all of them, or none."""

    workloads: list[WorkloadIn] = Field(min_length=1, max_length=BATCH_LIMIT)


class NodeIn(Body):
    name: Name
    gpus: int = Field(0, ge=0, le=1024)
    gpu_memory: Memory = "80GiB"
    gpu_model: str = Field("generic", min_length=1, max_length=63)
    cpu: Amount = 64.0
    memory: Memory = "512GiB"
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)
    devices: list[DeviceIn] | None = Field(
        None, description="the node's devices; virtual devices are made up when left out"
    )
    virtual: bool = False

    @field_validator("gpu_memory", "memory")
    @classmethod
    def _memory(cls, value: int | str) -> int | str:
        memory_bytes(value)
        return value

    @model_validator(mode="after")
    def _devices(self) -> NodeIn:
        if self.devices is not None:
            if len(self.devices) != self.gpus:
                raise ValueError(f"{len(self.devices)} devices listed for {self.gpus} GPUs")
            if sorted(device.index for device in self.devices) != list(range(self.gpus)):
                raise ValueError("device indices must be 0 to gpus-1, each once")
        return self

    def to_spec(self) -> NodeSpec:
        gpu_memory = memory_bytes(self.gpu_memory)
        virtual = self.virtual or self.devices is None
        devices = (
            tuple(
                Device(d.index, d.uuid, d.model, memory_bytes(d.memory), d.virtual)
                for d in self.devices
            )
            if self.devices is not None
            else tuple(
                Device(i, f"virtual-{self.name}-{i}", self.gpu_model, gpu_memory, True)
                for i in range(self.gpus)
            )
        )
        node = Node(
            name=self.name,
            gpus=self.gpus,
            gpu_memory=gpu_memory,
            gpu_model=self.gpu_model,
            cpu=self.cpu,
            memory=memory_bytes(self.memory),
            labels=dict(self.labels),
        )
        return NodeSpec(node, devices, virtual)


class DeviceOut(BaseModel):
    index: int
    uuid: str
    model: str
    memory: int
    virtual: bool


class TaskOnNodeOut(BaseModel):
    workload: str | None = Field(
        description="null for another project's workload, whose name a member may not read"
    )
    project: str
    task: int
    devices: list[int]
    gpu: float


class NodeOut(BaseModel):
    name: str
    gpus: int
    gpu_model: str
    gpu_memory: int
    cpu: float
    memory: int
    labels: dict[str, str]
    pool: str = Field(DEFAULT_POOL, description="its node pool: its `pool` label, or default")
    schedulable: bool
    state: str
    virtual: bool
    devices: list[DeviceOut]
    tasks: list[TaskOnNodeOut]
    allocated_gpu: float
    registered_at: float
    heartbeat_at: float | None
    address: str = Field(
        description="where the server reaches its tasks (its Ray node's address; loopback "
        "for this machine's agent)"
    )


# -- cluster, users -------------------------------------------------------------------------


class ClusterOut(BaseModel):
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


class SecretIn(Body):
    value: str = Field(
        min_length=1,
        max_length=65536,
        pattern=r"^[^\x00]*$",
        description="stored encrypted; never shown again",
    )


class SecretOut(BaseModel):
    name: str
    updated_at: float


class UserIn(Body):
    name: Name
    role: Literal["admin", "member", "viewer"] = Field(
        "member",
        description="admin: everything; viewer: reads every project, writes nothing; "
        "member: reads and submits in the projects they belong to",
    )
    project: Name | None = Field(
        None, description="a member's first project, where they are a `member`"
    )
    unix_user: UnixUser | None = Field(
        None,
        description="the Unix account its tasks run as when the agent runs as root; "
        "default: the account of the same name (never root)",
    )

    @field_validator("unix_user")
    @classmethod
    def _unix_user(cls, value: str | None) -> str | None:
        if value is not None and is_root_account(value):
            raise ValueError(
                f"{value!r} is root; only the operator may map the admin to root "
                "(--admin-unix-user), never a user created through the API"
            )
        return value

    @model_validator(mode="after")
    def _project(self) -> UserIn:
        if self.role == "member" and self.project is None:
            raise ValueError("a member needs a project")
        if self.role != "member" and self.project is not None:
            raise ValueError(f"only members belong to a project, not a {self.role}")
        return self

    def account(self) -> str | None:
        """The Unix account to record: the one given, else the user's own name when it is
        a valid login name (at most 32 characters)."""
        if self.unix_user is not None:
            return self.unix_user
        return self.name if len(self.name) <= 32 else None


class MembershipIn(Body):
    role: Literal["member", "project-admin"] = Field(
        "member",
        description="member: manages their own workloads of the project; project-admin: "
        "every workload of the project",
    )


class MembershipOut(BaseModel):
    project: str
    role: str


class UserOut(BaseModel):
    name: str
    role: str
    project: str | None = Field(description="the first of `projects`, or null")
    projects: list[MembershipOut] = Field(description="a member's projects and role in each")
    unix_user: str | None = Field(None, description="the Unix account its tasks run as")

    @classmethod
    def of(cls, record: UserRecord) -> UserOut:
        return cls(
            name=record.name,
            role=record.role,
            project=record.project,
            projects=[MembershipOut(project=p, role=r) for p, r in record.memberships],
            unix_user=record.unix_user,
        )


class TokenOut(BaseModel):
    user: str
    token: str = Field(description="shown once; only its digest is stored")
    id: int | None = Field(default=None, description="for `DELETE /tokens/{id}`")
    name: str | None = None
    expires_at: float | None = None


class TokenIn(Body):
    name: Name | None = Field(default=None, description="what the token is for")
    expires_in: float | str | None = Field(
        default=None,
        description='seconds, or "90m", "12h", "30d" (at most a year); none: never expires',
    )

    @field_validator("expires_in")
    @classmethod
    def _expires(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            duration_seconds(value)
        return value

    def expires_at(self, now: float) -> float | None:
        """When a token made at `now` expires."""
        return None if self.expires_in is None else now + duration_seconds(self.expires_in)


class TokenInfoOut(BaseModel):
    """A token as listed: never its value."""

    id: int
    user: str
    name: str | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None = Field(description="exact to about 10 s")
    active: bool = Field(description="neither revoked nor expired")


class AuditOut(BaseModel):
    """A write request: who (null for no valid token), when, what, from where, outcome. Or
    a session that entered (or tried to enter) a workload's task: method EXEC (exec,
    shell) or FORWARD (port-forward), status 101 once it opened, with the fields below."""

    id: int
    at: float
    user: str | None
    method: str
    route: str
    path: str
    address: str | None
    status: int
    workload: str | None = Field(None, description="a session's workload; null for a write")
    task: int | None = Field(None, description="a session's task")
    command: list[str] | None = Field(None, description="an exec session's command")
    ended_at: float | None = Field(None, description="when a session ended; null while open")
    exit_code: int | None = Field(
        None,
        description="an exec session's exit code; null while it runs, and when it ended "
        "otherwise (its client left, its user lost access)",
    )


class LogOut(BaseModel):
    workload: str
    task: int
    text: str
    offset: int = Field(description="pass it back as `offset` to read only what follows")
    tasks: list[int] = Field(description="tasks that have logs")


class ErrorOut(BaseModel):
    detail: str
