"""Quota and fair-share checks: limits, deserved quotas, and who is over its fair share.

Limits cap every workload at its queue and each ancestor; non-preemptible work must keep
its queues within their deserved quotas. Reclaim takes from queues over their fair share
for queues within theirs. Each check says why in the words the pending reasons use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from corral.engine.kinds import CPU, DIMENSIONS, GPU, MEMORY, Request
from corral.engine.state import QueueState, WorkloadState, amounts_fit
from corral.model.resources import EPSILON, format_gpus, format_memory, plural_gpus

NOTHING: Request = (0.0, 0.0, 0.0)
# A request of every resource: checks against it look at all three.
EVERYTHING: Request = (1.0, 1.0, 1.0)


def quota_block(ws: WorkloadState, request: Request) -> str | None:
    """Why `request` may not be added to the workload's queues, or None if it may."""
    return limit_block(ws, request) or deserved_block(ws, request)


def limit_block(ws: WorkloadState, request: Request) -> str | None:
    """Limits cap every workload, at its queue and at each ancestor."""
    for queue in ws.queue.path:
        if not amounts_fit(queue.alloc, request, queue.limit):
            resource = first_over(queue.alloc, request, queue.limit)
            return (
                f"queue {queue.name} would exceed its limit of "
                f"{amount_text(resource, queue.limit[resource])}"
            )
    return None


def deserved_block(ws: WorkloadState, request: Request) -> str | None:
    """Non-preemptible work must keep its queue and every ancestor within deserved."""
    if ws.preemptible:
        return None
    for queue in ws.queue.path:
        if not amounts_fit(queue.np_alloc, request, queue.deserved):
            resource = first_over(queue.np_alloc, request, queue.deserved)
            deserved = queue.deserved[resource]
            free = max(deserved - queue.np_alloc[resource], 0.0)
            needs = f"non-preemptible workload needs {amount_text(resource, request[resource])}"
            if deserved <= EPSILON:
                return f"{needs} but {queue.name} has no {_deserved_text(resource, 0)}"
            return (
                f"{needs} but {queue.name} has {_bare(resource, free)} of its "
                f"{_deserved_text(resource, deserved)} free"
            )
    return None


def could_stay_within_limit(gpus: float, limit_room: float, slack: float = EPSILON) -> bool:
    """A cheap necessary condition on GPUs alone (for the simulator): `gpus` more GPUs
    fit under the queues' limits, which leave `limit_room` GPUs (the least under any)."""
    return gpus <= limit_room + slack


def could_stay_within_deserved(
    gpus: float, preemptible: bool, deserved_room: float, slack: float = EPSILON
) -> bool:
    """A cheap necessary condition on GPUs alone (for the simulator): preemptible work
    always may; non-preemptible work of `gpus` GPUs only where its queues have
    `deserved_room` GPUs of deserved quota left for non-preemptible work."""
    return preemptible or gpus <= deserved_room + slack


def within_quota(ws: WorkloadState) -> bool:
    """The workload's queues, as they stand now, keep their limits, and non-preemptible
    work its deserved quotas."""
    for queue in ws.queue.path:
        if not amounts_fit(queue.alloc, NOTHING, queue.limit):
            return False
        if not ws.preemptible and not amounts_fit(queue.np_alloc, NOTHING, queue.deserved):
            return False
    return True


def amount_text(resource: int, amount: float) -> str:
    """An amount of one resource in words: "2 GPUs", "8 CPU cores", "64GiB memory"."""
    if resource == GPU:
        return plural_gpus(amount)
    if resource == CPU:
        return f"{format_gpus(amount)} CPU cores"
    return f"{format_memory(amount)} memory"


def _deserved_text(resource: int, deserved: float) -> str:
    """ "2 deserved GPUs"; with 0, the bare noun ("deserved GPUs") for "has no ..."."""
    amount = "" if deserved <= EPSILON else f"{format_gpus(deserved)} "
    if resource == GPU:
        return f"{amount}deserved {'GPU' if 0 < deserved <= 1 else 'GPUs'}"
    if resource == CPU:
        return f"{amount}deserved CPU cores"
    if not amount:
        return "deserved memory"
    return f"{format_memory(deserved)} of deserved memory"


def first_over(used: Sequence[float], request: Request, cap: Sequence[float]) -> int:
    """The first resource on which `used + request` exceeds `cap` (GPU when none does)."""
    for resource in DIMENSIONS:
        if used[resource] + request[resource] > cap[resource] + EPSILON:
            return resource
    return GPU


def _bare(resource: int, amount: float) -> str:
    return format_gpus(amount) if resource != MEMORY else format_memory(amount)


# -- fair share ------------------------------------------------------------------------


def over_fair_share(
    alloc: Sequence[float],
    fair_share: Sequence[float],
    request: Request = EVERYTHING,
    slack: float = EPSILON,
) -> bool:
    """Whether a queue holds more than its fair share of a resource `request` asks for
    (by default, of any resource)."""
    # Written out for the three resources: it is asked for every queue, many times a cycle.
    return (
        (request[GPU] > EPSILON and alloc[GPU] > fair_share[GPU] + slack)
        or (request[CPU] > EPSILON and alloc[CPU] > fair_share[CPU] + slack)
        or (request[MEMORY] > EPSILON and alloc[MEMORY] > fair_share[MEMORY] + slack)
    )


def within_fair_share(queue: QueueState, request: Request) -> int:
    """How many queues of `queue.path`, from the leaf up, stay within their fair share
    with `request` added."""
    reach = 0
    for level in queue.path:
        for resource in DIMENSIONS:
            if request[resource] > EPSILON and (
                level.alloc[resource] + request[resource] > level.fair_share[resource] + EPSILON
            ):
                return reach
        reach += 1
    return reach


def within_deserved(queue: QueueState, request: Request) -> int:
    """How many queues of `queue.path`, from the leaf up, stay within their deserved
    quota with `request` added."""
    reach = 0
    for level in queue.path:
        for resource in DIMENSIONS:
            if request[resource] > EPSILON and (
                level.alloc[resource] + request[resource] > level.deserved[resource] + EPSILON
            ):
                return reach
        reach += 1
    return reach


def above_deserved_at_share(
    alloc: Sequence[float],
    deserved: Sequence[float],
    fair_share: Sequence[float],
    request: Request = EVERYTHING,
) -> bool:
    """Whether a queue holds more than its deserved quota of a resource `request` asks
    for while holding at least its fair share of it."""
    return (
        (
            request[GPU] > EPSILON
            and alloc[GPU] > deserved[GPU] + EPSILON
            and alloc[GPU] >= fair_share[GPU] - EPSILON
        )
        or (
            request[CPU] > EPSILON
            and alloc[CPU] > deserved[CPU] + EPSILON
            and alloc[CPU] >= fair_share[CPU] - EPSILON
        )
        or (
            request[MEMORY] > EPSILON
            and alloc[MEMORY] > deserved[MEMORY] + EPSILON
            and alloc[MEMORY] >= fair_share[MEMORY] - EPSILON
        )
    )


def all_above_deserved(levels: Sequence[QueueState], wanted: Sequence[int]) -> bool:
    """True when every queue of `levels` holds more than its deserved quota, and at
    least its fair share, of one of the resources `wanted`."""
    for level in levels:
        alloc, share, deserved = level.alloc, level.fair_share, level.deserved
        if not any(
            alloc[resource] > deserved[resource] + EPSILON
            and alloc[resource] >= share[resource] - EPSILON
            for resource in wanted
        ):
            return False
    return True


def all_over(levels: Sequence[QueueState], wanted: Sequence[int]) -> bool:
    """True when every queue of `levels` is over its fair share of one of the resources
    `wanted`."""
    for level in levels:
        alloc, share = level.alloc, level.fair_share
        if not any(alloc[resource] > share[resource] + EPSILON for resource in wanted):
            return False
    return True


def served_ratio(queue: QueueState, request: Request) -> float:
    """Allocation over fair share on the dominant requested resource."""
    ratio = 0.0
    for resource in DIMENSIONS:
        if request[resource] <= EPSILON:
            continue
        share = queue.fair_share[resource]
        alloc = queue.alloc[resource]
        ratio = max(ratio, math.inf if share <= EPSILON else alloc / share)
    return ratio


def diverging(a: QueueState, b: QueueState) -> tuple[QueueState, QueueState]:
    """The queues on the paths of `a` and `b` just below where the two paths meet."""
    b_names = [queue.name for queue in b.path]
    for index, queue in enumerate(a.path):
        if queue.name in b_names:
            return a.path[max(index - 1, 0)], b.path[max(b_names.index(queue.name) - 1, 0)]
    return a.path[-1], b.path[-1]
