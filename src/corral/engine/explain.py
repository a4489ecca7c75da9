"""Why a workload waits (`corral why`), in the engine's own rules: its place in its project,
who holds the GPUs it could use, the queues on its path (deserved, limit, fair share,
allocated, and the effective weight of time-decayed fair share), and whether reclaim or
preemption may take GPUs for it, for each holder and, while node pools are in use, pool by
pool.

The rules, on GPUs, as the latest scheduling cycle left the queues: a queue may take GPUs
back (reclaim) only while it, and each department above it up to where it meets the other
queue, stays within its fair share with the workload added (`Reclaim.could_take`); it
takes them only from preemptible work whose queues, up to that meeting point, are over
theirs (`quota.over_fair_share`). Within a project, higher-priority work preempts
lower-priority preemptible work (`Preempt.could_preempt`). What the workload needs at once
is its minimum gang (`admission.minimum_gang`).

Plain values in, plain values out: the server reads the store and the last cycle's
decisions, and turns a `Why` into its answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from corral.engine.actions.preempt import Preempt
from corral.engine.actions.reclaim import Reclaim
from corral.engine.admission import minimum_gang, selected
from corral.engine.pools import queues_in
from corral.engine.quota import over_fair_share
from corral.model import Decisions, Node, Queue, QueueStatus
from corral.model.durations import format_duration
from corral.model.resources import EPSILON, format_gpus, plural_gpus
from corral.model.spec import WorkloadSpec
from corral.model.usage import DecaySetting, decay_settings

Statuses = Mapping[str, QueueStatus]
# A request of GPUs alone, for the fair-share rule on GPUs.
_GPU_ONLY = (1.0, 0.0, 0.0)
# Weights closer than this read as unchanged.
_SAME = 1e-9


@dataclass(frozen=True, slots=True)
class Holder:
    """Running work on a node the workload may use. `workload` is None where the asker
    may not read its name; `may_take` (for a pending workload) is `reclaim`, `preempt`,
    or `no: ` and why not."""

    workload: str | None
    project: str
    priority: int
    preemptible: bool
    node: str
    gpu: float
    may_take: str | None = None


@dataclass(frozen=True, slots=True)
class QueueOnPath:
    """A queue on the workload's path, in GPUs as the latest cycle saw them (None before
    the first; `limit` None: no limit)."""

    name: str
    deserved: float
    limit: float | None
    fair_share: float | None
    allocated: float | None
    effective_weight: float | None = None
    weight_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Why:
    """Why a workload waits: the engine's reason, its place among its project's pending
    work (`position` 1 for the next tried, `ahead` those tried before it), the holders of
    what it could use, what it `needs` at once, its queues, and what reclaim and
    preemption may do for it."""

    workload: str
    status: str
    reason: str | None
    position: int | None
    ahead: tuple[str, ...]
    holders: tuple[Holder, ...]
    needs: float = 0.0
    queues: tuple[QueueOnPath, ...] = ()
    reclaim: str | None = None
    preempt: str | None = None


def may_use(node: Node, spec: WorkloadSpec) -> bool:
    """Whether `spec` may run on `node`: its node selector and node pools allow it."""
    if not selected(node, spec.node_selector):
        return False
    return not spec.node_pools or node.pool in spec.node_pools


def weight_reason(
    queue: Queue, status: QueueStatus | None, settings: Mapping[str, DecaySetting]
) -> str | None:
    """ "weight 2 → 0.6: used 70% of the cluster's GPU-time over a 1d half-life", or None
    where time-decayed fair share is off (or before the first cycle). `settings` are the
    queues' own as they are now: a cycle that ran before the queue's was turned off has
    nothing to explain any more."""
    setting = settings.get(queue.name)
    if status is None or status.weight is None or setting is None:
        return None
    base = queue.over_quota_weight.gpu
    over = f" over a {format_duration(setting.half_life)} half-life"
    if setting.k != 1:
        over += f" (k = {setting.k:g})"
    used = f"used {(status.usage or 0.0):.0%} of the cluster's GPU-time{over}"
    if abs(status.weight - base) <= _SAME:
        return f"weight {base:g}, unchanged: {used}"
    return f"weight {base:g} → {status.weight:.2g}: {used}"


def deepen(why: Why, spec: WorkloadSpec, queues: Sequence[Queue], last: Decisions | None) -> Why:
    """`why` with the queues on its path and, for a pending workload, what reclaim and
    preemption may do for it."""
    by_name = {queue.name: queue for queue in queues}
    statuses: Statuses = last.queues if last is not None else {}
    path = _path(spec.project, by_name)
    need = sum(group.gpu * count for group, count in minimum_gang(spec))
    settings = decay_settings(queues)
    deeper = replace(
        why,
        needs=need,
        queues=tuple(_on_path(q, statuses.get(q.name), settings) for q in path),
    )
    if why.status != "pending":
        return deeper
    if not statuses:
        unknown = "not known before the first scheduling cycle"
        return replace(deeper, reclaim=unknown, preempt=unknown)
    holders = tuple(
        replace(holder, may_take=_may_take(holder, spec, need, path, by_name, statuses))
        for holder in why.holders
    )
    return replace(
        deeper,
        holders=holders,
        reclaim=_reclaim_summary(spec, need, path, statuses, holders),
        preempt=_preempt_summary(spec, need, holders),
    )


def deepen_by_pool(
    why: Why,
    spec: WorkloadSpec,
    queues: Sequence[Queue],
    last: Decisions | None,
    node_pools: Mapping[str, str],
) -> Why:
    """`deepen`, pool by pool when the latest cycle divided the cluster into pools
    (`node_pools`: each node's pool): each pool is divided on its own, so whether reclaim
    or preemption may help is said for each pool the workload may run in, in its order of
    preference, from the queues' quotas and shares in that pool and the work running on
    that pool's nodes. As `deepen` otherwise."""
    if last is None or not last.pools:
        return deepen(why, spec, queues, last)
    whole = deepen(why, spec, queues, last)
    if why.status != "pending":
        return whole
    holders: list[Holder] = []
    reclaim: list[str] = []
    preempt: list[str] = []
    for pool in spec.node_pools or tuple(last.pools):
        statuses = last.pools.get(pool)
        if statuses is None:
            reclaim.append(f"pool {pool}: no node in pool {pool}")
            continue
        here = tuple(holder for holder in why.holders if node_pools.get(holder.node) == pool)
        part = deepen(
            replace(why, holders=here),
            spec,
            queues_in(queues, pool),
            Decisions({}, (), {}, statuses),
        )
        holders.extend(part.holders)
        reclaim.append(f"pool {pool}: {part.reclaim}")
        preempt.append(f"pool {pool}: {part.preempt}")
    return replace(
        whole,
        holders=tuple(holders),
        reclaim="; ".join(reclaim),
        preempt="; ".join(preempt) or whole.preempt,
    )


def _path(project: str, by_name: Mapping[str, Queue]) -> list[Queue]:
    """The project and each department above it."""
    path: list[Queue] = []
    queue = by_name.get(project)
    while queue is not None and queue not in path:
        path.append(queue)
        queue = by_name.get(queue.parent) if queue.parent else None
    return path


def _on_path(
    queue: Queue, status: QueueStatus | None, settings: Mapping[str, DecaySetting]
) -> QueueOnPath:
    limit = queue.limit.gpu
    return QueueOnPath(
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
    if not Reclaim.could_take(need, held, share):
        return (
            f"{queue.name} holds {format_gpus(held)} of its fair share of "
            f"{plural_gpus(share)}, and {format_gpus(need)} more would exceed it"
        )
    return None


def _may_take(
    holder: Holder,
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
        if Preempt.could_preempt(spec.priority, holder.priority):
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
        if status is None:
            continue
        held, share = status.allocated.gpu, status.fair_share.gpu
        if not over_fair_share((held, 0.0, 0.0), (share, 0.0, 0.0), _GPU_ONLY):
            return (
                f"no: {queue.name} is within its fair share ({format_gpus(held)}"
                f" of {plural_gpus(share)})"
            )
    return "reclaim"


def _reclaim_summary(
    spec: WorkloadSpec,
    need: float,
    path: list[Queue],
    statuses: Statuses,
    holders: Sequence[Holder],
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


def _preempt_summary(spec: WorkloadSpec, need: float, holders: Sequence[Holder]) -> str:
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
