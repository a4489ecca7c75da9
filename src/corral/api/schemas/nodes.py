"""Bodies of nodes and their devices, and the cluster's summary."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator, model_validator

from corral.api.schemas.common import Amount, Body, LabelKey, LabelValue, Memory, Name, memory_bytes
from corral.model import (
    DEFAULT_POOL,
    Node,
)
from corral.model.spec import Device, NodeSpec


class DeviceIn(Body):
    index: int = Field(ge=0, le=1023)
    uuid: str = Field(min_length=1, max_length=128)
    model: str = Field(min_length=1, max_length=63)
    memory: Memory
    virtual: bool = False


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
