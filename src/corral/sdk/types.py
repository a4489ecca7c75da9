"""The JSON bodies the corral API answers with, as typed dictionaries.

They mirror the server's response schemas field for field, so that users' code (and the
CLI, which prints them with --json) gets the API's JSON unchanged but typed.
"""

from __future__ import annotations

from typing import Literal, TypedDict

WorkloadStatus = Literal["pending", "running", "suspended", "succeeded", "failed"]
Role = Literal["admin", "member", "viewer"]


class Amounts(TypedDict):
    """Resource amounts; None means unlimited (a limit) or not managed (a quota)."""

    gpu: float | None
    cpu: float | None
    memory: int | None


class WeightsOut(TypedDict):
    gpu: float
    cpu: float
    memory: float


class RuleOut(TypedDict):
    """Limits a queue sets on one class of its work, in seconds; None means no limit."""

    idle_timeout: float | None
    max_runtime: float | None


class QueueOut(TypedDict):
    name: str
    parent: str | None
    department: bool
    children: list[str]
    deserved: Amounts
    limit: Amounts
    over_quota_weight: WeightsOut
    priority: int
    fair_share: Amounts | None
    allocated: Amounts | None
    requested: Amounts | None
    pending_gpu: float | None
    rules: dict[str, RuleOut]
    created_at: float


class TaskGroupOut(TypedDict):
    name: str
    replicas: int
    gpu: float
    gpu_memory: int
    cpu: float
    memory: int


class PlacementOut(TypedDict):
    task: int
    node: str
    devices: list[int]
    gpu: float


class TopologyOut(TypedDict):
    key: str
    required: bool


class WorkloadOut(TypedDict):
    name: str
    project: str
    user: str
    status: WorkloadStatus
    reason: str | None
    priority: int
    preemptible: bool
    tasks: list[TaskGroupOut]
    min_available: int | None
    node_selector: dict[str, list[str]]
    topology: TopologyOut | None
    command: list[str]
    env: dict[str, str]
    workdir: str | None
    max_runtime: float | None
    backoff_limit: int
    grace_period: float
    attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    placements: list[PlacementOut]


class LogOut(TypedDict):
    workload: str
    task: int
    text: str
    offset: int
    tasks: list[int]


class EventOut(TypedDict):
    id: int
    time: float
    workload: str | None
    node: str | None
    kind: str
    cause: str
    reason: str


class HolderOut(TypedDict):
    workload: str
    project: str
    priority: int
    preemptible: bool
    node: str
    gpu: float


class WhyOut(TypedDict):
    workload: str
    status: str
    reason: str | None
    position: int | None
    ahead: list[str]
    holders: list[HolderOut]


class DeviceOut(TypedDict):
    index: int
    uuid: str
    model: str
    memory: int
    virtual: bool


class TaskOnNodeOut(TypedDict):
    workload: str
    project: str
    task: int
    devices: list[int]
    gpu: float


class NodeOut(TypedDict):
    name: str
    gpus: int
    gpu_model: str
    gpu_memory: int
    cpu: float
    memory: int
    labels: dict[str, str]
    schedulable: bool
    state: str
    virtual: bool
    devices: list[DeviceOut]
    tasks: list[TaskOnNodeOut]
    allocated_gpu: float
    registered_at: float
    heartbeat_at: float | None


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


class UserOut(TypedDict):
    name: str
    role: Role
    project: str | None


class TokenOut(TypedDict):
    user: str
    token: str


class UsageRowOut(TypedDict):
    """GPU-hours of one project, department, user or workload over a period."""

    key: str
    gpu_hours_allocated: float
    gpu_hours_used: float
    gpu_hours_idle: float
