"""Bodies of workloads: submissions (one, a batch), their tasks, ports and topology, and
what the API answers about them (the workload, its events, logs and why it waits)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from corral.api.schemas.common import (
    AFTER_PATTERN,
    BATCH_LIMIT,
    ENV_PATTERN,
    Amount,
    Argument,
    Body,
    LabelKey,
    LabelValue,
    Memory,
    Name,
    OsString,
    PoolName,
    SecretName,
    duration_seconds,
    memory_bytes,
)
from corral.model import (
    DEFAULT_GRACE_PERIOD,
    TaskGroup,
    Topology,
    default_preemptible,
    resolve_priority,
)
from corral.model.arrays import parse_array, parse_dependency
from corral.model.spec import (
    CONTAINERS_LABEL,
    CONTAINERS_VALUE,
    PortSpec,
    PythonEnv,
    WorkloadSpec,
    workload_key,
)
from corral.spec.limits import (
    MAX_REPLICAS,
    MAX_TASK_GROUPS,
    gpu_problem,
    tasks_problem,
)
from corral.spec.travel import (
    FIND_LINKS_MAX,
    URL_MAX,
    URL_PATTERN,
    VERSION_PATTERN,
    code_problem,
    image_problem,
    python_files_problem,
)


def distinct_pools(value: list[str]) -> list[str]:
    """Node pools in order of preference, each once."""
    twice = sorted({pool for pool in value if value.count(pool) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)}: listed twice")
    return value


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


Url = Annotated[str, Field(pattern=URL_PATTERN, max_length=URL_MAX)]


class PythonIn(Body):
    """A Python environment its node builds with uv for the workload's tasks, once per
    node for every workload that asks for the same one."""

    requirements: dict[str, str] = Field(
        description="what to install, by file name: requirements.txt; or pyproject.toml, "
        "with uv.lock when it has one",
    )
    version: Annotated[str, Field(pattern=VERSION_PATTERN)] | None = Field(
        None, description='the Python version, such as "3.11"; default: the node\'s'
    )
    index_url: Url | None = Field(None, description="the package index, instead of the node's")
    find_links: list[Url] = Field(
        default_factory=list,
        max_length=FIND_LINKS_MAX,
        description="pages with links to packages, besides the index",
    )

    @field_validator("requirements")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        problem = python_files_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    def to_model(self) -> PythonEnv:
        return PythonEnv(
            files=tuple(sorted(self.requirements.items())),
            version=self.version,
            index_url=self.index_url,
            find_links=tuple(self.find_links),
        )


class PythonOut(BaseModel):
    files: list[str] = Field(description="the names of the files that say what to install")
    version: str | None
    index_url: str | None
    find_links: list[str]


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
    after: list[Annotated[str, Field(pattern=AFTER_PATTERN, max_length=135)]] = Field(
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

    code: str | None = Field(
        None,
        description="the digest of a code snapshot of the project (PUT /v1/projects/PROJECT/"
        "code/DIGEST): each task starts in a private copy of it, as its working directory "
        "(a relative workdir is taken from it)",
    )
    python: PythonIn | None = Field(
        None, description="a Python environment for its tasks, built on their node with uv"
    )
    image: str | None = Field(
        None, description="an OCI image its tasks run in (podman, on nodes that can)"
    )

    @field_validator("code")
    @classmethod
    def _code(cls, value: str | None) -> str | None:
        problem = None if value is None else code_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        problem = None if value is None else image_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

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
        return distinct_pools(value)

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
        if self.image is not None and self.python is not None:
            raise ValueError("give an image or a Python environment, not both")
        if self.image is not None and self.workdir is not None and self.workdir.startswith("/"):
            raise ValueError(
                "workdir: in an image, give a directory relative to the workload's own (or "
                "to its code's copy): only those are in its container"
            )
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(f"{', '.join(both)}: in both env and secrets")
        if self.array is not None and self.name is not None:
            longest = f"{self.name}-{parse_array(self.array)[0][-1]}"
            if len(longest) > 63:
                raise ValueError(f"name: the array member {longest!r} is over 63 characters")
        return self

    def _selector_model(self) -> dict[str, tuple[str, ...]]:
        """The node selector, with the nodes that run images for a workload that has one."""
        selector = {
            key: tuple(values) if isinstance(values, list) else (values,)
            for key, values in self.node_selector.items()
        }
        if self.image is not None:
            selector.setdefault(CONTAINERS_LABEL, (CONTAINERS_VALUE,))
        return selector

    def to_spec(self, name: str, user: str) -> WorkloadSpec:
        """The workload `name` of its project, as the store keeps it (its key is
        PROJECT/NAME: corral.model.spec.workload_key)."""
        priority = resolve_priority(self.priority)
        return WorkloadSpec(
            name=workload_key(self.project, name),
            project=self.project,
            user=user,
            task_groups=tuple(group.to_model() for group in self.tasks),
            priority=priority,
            preemptible=(
                default_preemptible(priority) if self.preemptible is None else self.preemptible
            ),
            min_available=self.min_available,
            node_selector=self._selector_model(),
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
            code=self.code,
            python=self.python.to_model() if self.python is not None else None,
            image=self.image,
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
    code: str | None = Field(None, description="the digest of its code snapshot")
    python: PythonOut | None = None
    image: str | None = None
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


class WorkloadBatchIn(Body):
    """Several workloads submitted together: all of them, or none."""

    workloads: list[WorkloadIn] = Field(min_length=1, max_length=BATCH_LIMIT)


class LogOut(BaseModel):
    workload: str
    task: int
    text: str
    offset: int = Field(description="pass it back as `offset` to read only what follows")
    tasks: list[int] = Field(description="tasks that have logs")
