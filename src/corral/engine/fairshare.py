"""Fair-share division of one resource among sibling queues.

Each queue first gets min(deserved, demand). What is left of the parent's amount then
goes to queues that still want more: higher queue priority first, and within one
priority in proportion to over-quota weight, capped by each queue's demand and limit.
When a queue reaches its cap the rest is divided again among the others (water filling).
The division is applied level by level from the root, each parent's fair share being
the amount its children divide.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

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
    caps = [min(claim.demand, claim.limit) for claim in claims]
    shares = [min(claim.deserved, cap) for claim, cap in zip(claims, caps, strict=True)]
    remaining = amount - sum(share for share in shares if math.isfinite(share))
    order = sorted(range(len(claims)), key=lambda index: -claims[index].priority)
    for _, group in groupby(order, key=lambda index: claims[index].priority):
        if remaining <= EPSILON:
            break
        remaining = _water_fill(remaining, list(group), claims, caps, shares)
    return shares


def _water_fill(
    amount: float,
    members: list[int],
    claims: Sequence[Claim],
    caps: list[float],
    shares: list[float],
) -> float:
    """Give `amount` to `members` by weight, capped; updates `shares`, returns what is left."""
    active = [i for i in members if claims[i].weight > 0 and shares[i] < caps[i] - EPSILON]
    while active and amount > EPSILON:
        total_weight = sum(claims[i].weight for i in active)
        capped = []
        given = 0.0
        for i in active:
            offer = amount * claims[i].weight / total_weight
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
