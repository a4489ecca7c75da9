"""Bodies of queues (projects and departments): quotas, weights, pools, rules."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, field_validator

from corral.api.rules import RuleOut, RulesIn
from corral.api.schemas.common import (
    Amount,
    Body,
    Memory,
    MinRuntime,
    Name,
    PoolName,
    UsageFactor,
    memory_bytes,
)
from corral.model import (
    DEFAULT_POOL,
    PoolQuota,
    Queue,
    Resources,
)


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
