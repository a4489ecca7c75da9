"""`corral why` as deep as `corral plan`: the queues on the workload's path (deserved,
limit, fair share, allocated), whether reclaim or preemption may take GPUs for it, and for
each holder of the GPUs it could use whether it may be taken, and why not.

The engine's rules, on GPUs, as the latest scheduling cycle left the queues: a queue may
take GPUs back (reclaim) only while it, and each department above it up to where it meets
the other queue, stays within its fair share with the workload added; it takes them only
from preemptible work whose queues, up to that meeting point, are over theirs. Within a
project, higher-priority work preempts lower-priority preemptible work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from corral.api.schemas.workloads import HolderOut, WhyOut, WhyQueueOut
from corral.api.weights import settings_of, weight_reason
from corral.engine.admission import minimum_gang
from corral.model import Decisions, Queue, QueueStatus
from corral.model.resources import EPSILON, format_gpus, plural_gpus
from corral.model.spec import WorkloadSpec
from corral.model.usage import DecaySetting

Statuses = Mapping[str, QueueStatus]


def deepen(
    why: WhyOut, spec: WorkloadSpec, queues: Sequence[Queue], last: Decisions | None
) -> WhyOut:
    """`why` with the queues on its path and, for a pending workload, what reclaim and
    preemption may do for it."""
    by_name = {queue.name: queue for queue in queues}
    statuses: Statuses = last.queues if last is not None else {}
    path = _path(spec.project, by_name)
    need = sum(group.gpu * count for group, count in minimum_gang(spec))
    settings = settings_of(queues)
    deeper = why.model_copy(
        update={
            "needs": need,
            "queues": [_queue_out(q, statuses.get(q.name), settings) for q in path],
        }
    )
    if why.status != "pending":
        return deeper
    if not statuses:
        unknown = "not known before the first scheduling cycle"
        return deeper.model_copy(update={"reclaim": unknown, "preempt": unknown})
    holders = [
        holder.model_copy(
            update={"may_take": _may_take(holder, spec, need, path, by_name, statuses)}
        )
        for holder in why.holders
    ]
    return deeper.model_copy(
        update={
            "holders": holders,
            "reclaim": _reclaim_summary(spec, need, path, statuses, holders),
            "preempt": _preempt_summary(spec, need, holders),
        }
    )


def _path(project: str, by_name: Mapping[str, Queue]) -> list[Queue]:
    """The project and each department above it."""
    path: list[Queue] = []
    queue = by_name.get(project)
    while queue is not None and queue not in path:
        path.append(queue)
        queue = by_name.get(queue.parent) if queue.parent else None
    return path


def _queue_out(
    queue: Queue, status: QueueStatus | None, settings: Mapping[str, DecaySetting]
) -> WhyQueueOut:
    limit = queue.limit.gpu
    return WhyQueueOut(
        name=queue.name,
        deserved=queue.deserved.gpu,
        limit=None if math.isinf(limit) else limit,
        fair_share=status.fair_share.gpu if status else None,
        allocated=status.allocated.gpu if status else None,
        effective_weight=status.weight if status else None,
        weight_reason=weight_reason(queue, status, settings),
    )


def _over_with(queue: Queue, need: float, statuses: Statuses) -> str | None:
    """Why `queue` may not reclaim `need` more GPUs: it would exceed its fair share."""
    status = statuses.get(queue.name)
    if status is None:
        return None
    held, share = status.allocated.gpu, status.fair_share.gpu
    if held + need > share + EPSILON:
        return (
            f"{queue.name} holds {format_gpus(held)} of its fair share of "
            f"{plural_gpus(share)}, and {format_gpus(need)} more would exceed it"
        )
    return None


def _may_take(
    holder: HolderOut,
    spec: WorkloadSpec,
    need: float,
    path: list[Queue],
    by_name: Mapping[str, Queue],
    statuses: Statuses,
) -> str:
    """`reclaim`, `preempt`, or `no: ` and why not, for the GPUs of one holder."""
    if not holder.preemptible:
        return "no: it is not preemptible"
    if holder.project == spec.project:
        if holder.priority < spec.priority:
            return "preempt"
        return "no: same project, and its priority is not lower"
    mine = [queue.name for queue in path]
    theirs = _path(holder.project, by_name)
    meet = next((q.name for q in theirs if q.name in mine), None)
    for queue in path:
        if queue.name == meet:
            break
        over = _over_with(queue, need, statuses)
        if over is not None:
            return f"no: {over}"
    for queue in theirs:
        if queue.name == meet:
            break
        status = statuses.get(queue.name)
        if status is not None and status.allocated.gpu <= status.fair_share.gpu + EPSILON:
            return (
                f"no: {queue.name} is within its fair share ({format_gpus(status.allocated.gpu)}"
                f" of {plural_gpus(status.fair_share.gpu)})"
            )
    return "reclaim"


def _reclaim_summary(
    spec: WorkloadSpec,
    need: float,
    path: list[Queue],
    statuses: Statuses,
    holders: list[HolderOut],
) -> str:
    if path:
        over = _over_with(path[0], need, statuses)
        if over is not None:
            return f"not allowed: {over}"
    takeable = [h for h in holders if h.may_take == "reclaim"]
    if not takeable:
        return (
            f"allowed for {spec.project}, but no other project's preemptible work over its "
            "fair share runs on the nodes it may use"
        )
    gpus = sum(h.gpu for h in takeable)
    projects = ", ".join(sorted({h.project for h in takeable}))
    text = f"{plural_gpus(gpus)} may be taken back from {projects} (over their fair share)"
    if gpus + EPSILON < need:
        text += f", less than the {plural_gpus(need)} it needs"
    return text


def _preempt_summary(spec: WorkloadSpec, need: float, holders: list[HolderOut]) -> str:
    takeable = [h for h in holders if h.may_take == "preempt"]
    if not takeable:
        return (
            f"nothing to preempt: no lower-priority preemptible work of {spec.project} runs "
            "on the nodes it may use"
        )
    gpus = sum(h.gpu for h in takeable)
    text = f"{plural_gpus(gpus)} of lower-priority work of {spec.project} may be preempted"
    if gpus + EPSILON < need:
        text += f", less than the {plural_gpus(need)} it needs"
    return text
