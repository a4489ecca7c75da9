"""Fair-share division of one resource among sibling queues.

Each queue first gets min(deserved, demand). What is left of the parent's amount then
goes to queues that still want more: higher queue priority first, and within one
priority in proportion to over-quota weight, capped by each queue's demand and limit.
When a queue reaches its cap the rest is divided again among the others (water filling).
The division is applied level by level from the root, each parent's fair share being
the amount its children divide.

Time-decayed fair share (`decayed_weights`) changes only the GPU weights the surplus is
divided by: a queue that used more of its siblings' GPU-time than its weight's part of
them gets a lower weight, one that used less a higher one. Deserved quotas stay as they
are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Protocol

from corral.engine.kinds import DIMENSIONS, GPU
from corral.model.resources import EPSILON


@dataclass(frozen=True, slots=True)
class Claim:
    """What one sibling brings to the division of one resource."""

    deserved: float
    demand: float
    limit: float = math.inf
    weight: float = 1.0
    priority: int = 100


def divide(amount: float, claims: Sequence[Claim]) -> list[float]:
    """Split `amount` among `claims`; returns each claim's fair share, in claim order.

    A deserved quota is honoured even when the deserved quotas add up to more than
    `amount` (over-subscribed quotas); only the over-quota part is bounded by `amount`.
    """
    return _divide(
        amount,
        [claim.deserved for claim in claims],
        [min(claim.demand, claim.limit) for claim in claims],
        [claim.weight for claim in claims],
        [claim.priority for claim in claims],
    )


def _divide(
    amount: float,
    deserved: list[float],
    caps: list[float],
    weights: list[float],
    priorities: list[int],
) -> list[float]:
    """`divide` on the claims' fields, each demand already capped by its limit."""
    shares = [cap if cap < quota else quota for quota, cap in zip(deserved, caps, strict=True)]
    if not any(
        weight > 0 and share < cap - EPSILON
        for weight, share, cap in zip(weights, shares, caps, strict=True)
    ):
        # Nobody wants more than its deserved quota: nothing is left to divide.
        return shares
    # What the finite shares take (all of them are, unless a quota is infinite).
    taken = sum(shares)
    if not math.isfinite(taken):
        taken = sum(share for share in shares if math.isfinite(share))
    remaining = amount - taken
    if len(set(priorities)) == 1:
        # One priority (the usual case): one group, in claim order.
        if remaining > EPSILON:
            _water_fill(remaining, list(range(len(shares))), weights, caps, shares)
        return shares
    order = sorted(range(len(shares)), key=lambda index: -priorities[index])
    for _, group in groupby(order, key=lambda index: priorities[index]):
        if remaining <= EPSILON:
            break
        remaining = _water_fill(remaining, list(group), weights, caps, shares)
    return shares


def _water_fill(
    amount: float,
    members: list[int],
    weights: list[float],
    caps: list[float],
    shares: list[float],
) -> float:
    """Give `amount` to `members` by weight, capped; updates `shares`, returns what is left."""
    active = [i for i in members if weights[i] > 0 and shares[i] < caps[i] - EPSILON]
    while active and amount > EPSILON:
        total_weight = sum([weights[i] for i in active])
        capped = []
        given = 0.0
        for i in active:
            offer = amount * weights[i] / total_weight
            room = caps[i] - shares[i]
            if offer >= room - EPSILON:
                shares[i] += room
                given += room
                capped.append(i)
            else:
                shares[i] += offer
                given += offer
        amount -= given
        if not capped:
            return 0.0
        active = [i for i in active if i not in capped]
    return max(amount, 0.0)


class Claimant(Protocol):
    """A queue as `divide_tree` reads it: per resource (GPU, CPU, memory) its deserved
    quota, what its work requests, its limit and its over-quota weight."""

    @property
    def name(self) -> str: ...
    @property
    def deserved(self) -> Sequence[float]: ...
    @property
    def requested(self) -> Sequence[float]: ...
    @property
    def limit(self) -> Sequence[float]: ...
    @property
    def weight(self) -> Sequence[float]: ...
    @property
    def priority(self) -> int: ...
    @property
    def children(self) -> Sequence[Claimant]: ...


def divide_tree(
    siblings: Sequence[Claimant],
    amounts: Sequence[float],
    gpu_weights: Mapping[str, float] | None = None,
) -> dict[str, list[float]]:
    """Fair shares of GPU, CPU and memory by queue name: `amounts` divided among
    `siblings`, then each one's share among its children, level by level. A queue in
    `gpu_weights` divides the GPU surplus by that weight instead of its own."""
    priorities = [queue.priority for queue in siblings]
    by_resource: list[list[float]] = []
    for resource in DIMENSIONS:
        deserved = [queue.deserved[resource] for queue in siblings]
        # Each demand capped by its limit (as min() does it, a builtin call per queue).
        caps = [
            limit
            if (limit := queue.limit[resource]) < (demand := queue.requested[resource])
            else demand
            for queue in siblings
        ]
        if deserved.count(math.inf) == len(deserved):
            # An unmanaged resource: every queue gets what it asks for, up to its limit.
            divided = caps
        else:
            if gpu_weights and resource == GPU:
                weights = [
                    gpu_weights.get(queue.name, queue.weight[resource]) for queue in siblings
                ]
            else:
                weights = [queue.weight[resource] for queue in siblings]
            divided = _divide(amounts[resource], deserved, caps, weights, priorities)
        by_resource.append(divided)
    shares = {
        queue.name: [gpu, cpu, memory]
        for queue, gpu, cpu, memory in zip(siblings, *by_resource, strict=True)
    }
    for queue in siblings:
        if queue.children:
            shares.update(divide_tree(queue.children, shares[queue.name], gpu_weights))
    return shares


def decayed_weight(weight: float, total_weight: float, share: float, k: float) -> float:
    """A queue's over-quota weight after its usage: `max(0, w + k * (w - W * s))`, where
    `W` is the sum of its siblings' weights (its own included) and `s` its share of their
    usage. In normalised terms `w/W + k * (w/W - s)`, scaled back by `W` so that the
    result reads in the queue's own units and multiplying every weight by a constant
    changes nothing."""
    return max(0.0, weight + k * (weight - total_weight * share))


def decayed_weights(
    siblings: Sequence[Claimant], usage: Mapping[str, float], factors: Mapping[str, float]
) -> dict[str, float]:
    """The GPU over-quota weight of each queue of the tree under `siblings` that has
    time-decayed fair share on (`factors`: its usage factor k), given each queue's usage
    share of the cluster (`usage`; absent is 0).

    Usage is compared among siblings: a queue's share is its usage over the sum of its
    siblings' (its own included), so a project is weighed against the other projects of
    its department. Where siblings have no weight or no usage, weights stay as they are."""
    weights: dict[str, float] = {}
    total_weight = sum(queue.weight[GPU] for queue in siblings)
    total_usage = sum(usage.get(queue.name, 0.0) for queue in siblings)
    for queue in siblings:
        k = factors.get(queue.name)
        if k is None:
            pass
        elif total_weight > 0 and total_usage > 0:
            share = usage.get(queue.name, 0.0) / total_usage
            weights[queue.name] = decayed_weight(queue.weight[GPU], total_weight, share, k)
        else:
            weights[queue.name] = queue.weight[GPU]
        if queue.children:
            weights.update(decayed_weights(queue.children, usage, factors))
    return weights
