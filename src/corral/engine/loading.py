"""Loading a snapshot's workloads into a cycle's state, afresh or onto the state a
Scheduler kept from its last cycle.

A kept workload that runs as the snapshot says stays as it is; any other is loaded
afresh, and kept ones the snapshot no longer has are taken off. What the cycle keeps
about the workloads as a whole (their task shapes, their demand) is kept up to date as
they come and go, so that a cycle costs what changed, not what runs.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

from corral.engine.demand import Demand
from corral.engine.errors import SnapshotError
from corral.engine.fragmentation import Shape, task_shapes
from corral.engine.state import ClusterState, QueueState, WorkloadState
from corral.model import Placement, Snapshot, Workload

_SUBMITTED = operator.attrgetter("submitted", "name")


@dataclass(slots=True)
class Loading:
    """How to load, and what to keep up to date while loading.

    `fresh`: the state is new (tasks are loaded without keeping its indices up to date).
    `shapes`: the workloads' tasks by shape. `kinds`: the table of what makes workloads
    alike. `demand`: the exact sums of their demands (None when afresh: summed once
    every demand is known). `changed`: filled with the workloads whose demand is to be
    worked out, and counted, this cycle."""

    fresh: bool
    max_memory: int
    shapes: Counter[Shape]
    kinds: dict[object, object]
    demand: Demand | None
    changed: list[WorkloadState]


def load_workloads(
    snapshot: Snapshot,
    queues: dict[str, QueueState],
    state: ClusterState,
    previous: dict[str, WorkloadState],
    loading: Loading,
    multi: set[str],
) -> dict[str, WorkloadState]:
    """The snapshot's workloads by name, oldest first, with their running tasks in
    `state`; `previous` (the kept workloads by name) is emptied. `multi` is given the
    names of those that run two tasks or more."""
    # Kept work changes with the indices kept up to date; fresh work loads without.
    load = state.load if loading.fresh else state.add
    leaves = _leaves(queues)
    loaded: dict[str, WorkloadState] = {}
    for workload in sorted(snapshot.workloads, key=_SUBMITTED):
        name = workload.name
        ws = previous.pop(name, None)
        if ws is not None and _as_left(ws, workload):
            loaded[name] = ws
            continue
        if name in loaded:
            raise SnapshotError(f"workload {name}: listed twice")
        ws = loaded[name] = _load(workload, ws, state, leaves, loading, load)
        if len(ws.running) > 1:
            multi.add(name)
    for gone in previous.values():
        _take_off(state, gone, loading)
    previous.clear()
    return loaded


def load_changes(
    snapshot: Snapshot,
    queues: dict[str, QueueState],
    state: ClusterState,
    kept: dict[str, WorkloadState],
    loading: Loading,
    before: tuple[Workload, ...],
    recheck: Collection[str],
    multi: set[str],
) -> dict[str, WorkloadState]:
    """What `load_workloads` gives, worked out from the last cycle's kept workloads by
    what changed: `before` holds the workloads of that cycle's snapshot, and `recheck`
    the names of those that cycle decided about. A workload given as the very same
    object is as it was unless it is among those or runs two tasks or more (`multi`,
    kept up to date): a busy cluster's running work is not looked at one by one, and
    costs the cycle only a pass or two in C. `kept` is changed in place."""
    left_behind, arrived = _differences(before, snapshot.workloads)
    left = {workload.name for workload in left_behind}
    leaves = _leaves(queues)
    newest = _SUBMITTED(next(reversed(kept.values())).workload) if kept else None
    reorder = False
    seen: set[str] = set()
    for workload in sorted(arrived, key=_SUBMITTED):
        name = workload.name
        ws = kept.get(name)
        if name in seen or (ws is not None and name not in left):
            raise SnapshotError(f"workload {name}: listed twice")
        seen.add(name)
        if ws is None:
            key = _SUBMITTED(workload)
            reorder = reorder or (newest is not None and key < newest)
            newest = key if newest is None else max(newest, key)
        elif ws.workload.submitted != workload.submitted:
            reorder = True
        kept[name] = _reloaded(workload, ws, state, leaves, loading, multi)
    for name in left - seen:
        multi.discard(name)
        _take_off(state, kept.pop(name), loading)
    for name in [*recheck, *multi]:
        ws = kept.get(name)
        if ws is None or name in seen:
            continue
        seen.add(name)
        if not _as_left(ws, ws.workload):
            kept[name] = _reloaded(ws.workload, ws, state, leaves, loading, multi)
    if reorder:
        kept = dict(sorted(kept.items(), key=lambda item: _SUBMITTED(item[1].workload)))
    return kept


# Past this many differences in place, the workloads are matched by identity instead.
_ALIGNED_SHARE = 8


def _differences(
    before: tuple[Workload, ...], now: tuple[Workload, ...]
) -> tuple[list[Workload], list[Workload]]:
    """The workloads of `before` that `now` no longer lists (as the very same object),
    and those of `now` that `before` did not. A caller that keeps a snapshot changes a
    few of its workloads in place and adds new ones at the end: compared place by
    place, in C. Otherwise they are matched by identity, in C too."""
    common = min(len(before), len(now))
    same = list(map(operator.is_, before, now))
    if common - sum(same) <= common // _ALIGNED_SHARE:
        places = []
        place = -1
        while True:
            try:
                place = same.index(False, place + 1)
            except ValueError:
                break
            places.append(place)
        gone = [before[place] for place in places]
        gone.extend(before[common:])
        came = [now[place] for place in places]
        came.extend(now[common:])
        if not gone or not came:
            return gone, came
        # A workload that only moved is neither.
        moved = {id(w) for w in gone} & {id(w) for w in came}
        if not moved:
            return gone, came
        return [w for w in gone if id(w) not in moved], [w for w in came if id(w) not in moved]
    then = dict(zip(map(id, before), before, strict=True))
    ids = dict(zip(map(id, now), now, strict=True))
    if len(ids) != len(now):
        _listed_twice(now)
    return [then[key] for key in then.keys() - ids.keys()], [
        ids[key] for key in ids.keys() - then.keys()
    ]


def _leaves(queues: dict[str, QueueState]) -> dict[str, QueueState]:
    return {name: queue for name, queue in queues.items() if queue.leaf}


def _as_left(ws: WorkloadState, workload: Workload) -> bool:
    """Whether the kept `ws` stands for `workload` as it is: given as last time (in a
    leaf queue then, and the queues are the same), and the last cycle left it as it was
    (with one task or none, so in the same order too): the common case, kept cheap."""
    if (
        ws.workload is workload
        and not ws.started
        and len(ws.running) == len(ws.original)
        and len(ws.running) < 2
    ):
        ws.reason = None
        return True
    return False


def _reloaded(
    workload: Workload,
    ws: WorkloadState | None,
    state: ClusterState,
    leaves: dict[str, QueueState],
    loading: Loading,
    multi: set[str],
) -> WorkloadState:
    """`_load` onto a kept state, keeping `multi` up to date."""
    ws = _load(workload, ws, state, leaves, loading, state.add)
    if len(ws.running) > 1:
        multi.add(workload.name)
    else:
        multi.discard(workload.name)
    return ws


def _load(
    workload: Workload,
    ws: WorkloadState | None,
    state: ClusterState,
    leaves: dict[str, QueueState],
    loading: Loading,
    load: Callable[[WorkloadState, Placement], None],
) -> WorkloadState:
    """The state of `workload` for this cycle: its kept state `ws` carried over when it
    runs as `workload` says, else a new one (the kept one taken off)."""
    name = workload.name
    queue = leaves.get(workload.queue)
    if queue is None:
        raise SnapshotError(f"workload {name}: {workload.queue!r} is not a leaf queue")
    if ws is not None:
        if _runs_as(ws, workload):
            if ws.started or len(ws.running) != len(ws.original):
                # It started or shrank: its demand is worked out again.
                _uncount(ws, loading)
            _carry_over(ws, workload)
            return ws
        _take_off(state, ws, loading)
    ws = WorkloadState(workload, queue, workload.tasks(), kinds=loading.kinds)
    ws.shapes = task_shapes(workload, loading.max_memory)
    for shape, tasks in ws.shapes:
        loading.shapes[shape] += tasks
    for placement in workload.placements:
        if placement.node not in state.by_name:
            raise SnapshotError(f"workload {name}: unknown node {placement.node!r}")
        load(ws, placement)
    ws.original = dict(ws.running)
    loading.changed.append(ws)
    return ws


def _listed_twice(workloads: tuple[Workload, ...]) -> None:
    """Raise SnapshotError for the first workload listed twice."""
    seen: set[str] = set()
    for workload in workloads:
        if workload.name in seen:
            raise SnapshotError(f"workload {workload.name}: listed twice")
        seen.add(workload.name)


def _uncount(ws: WorkloadState, loading: Loading) -> None:
    """Forget a kept workload's demand (it is worked out, and counted, again)."""
    if loading.demand is not None and ws.demand is not None:
        loading.demand.take_off(ws)
    ws.demand = None
    loading.changed.append(ws)


def _take_off(state: ClusterState, ws: WorkloadState, loading: Loading) -> None:
    """Take a kept workload's tasks off the state, out of the shape counts and out of
    the demand."""
    state.remove(ws)
    shapes = loading.shapes
    for shape, tasks in ws.shapes or ():
        if shapes[shape] == tasks:
            del shapes[shape]
        else:
            shapes[shape] -= tasks
    if loading.demand is not None and ws.demand is not None:
        loading.demand.take_off(ws)
    ws.release()


def _carry_over(ws: WorkloadState, workload: Workload) -> None:
    """Make the kept `ws`, which runs as `workload` says, stand for it at the start of
    this cycle."""
    if ws.workload is not workload:
        ws.workload = workload
        ws.gang = None
        ws.sized = False
        ws.kind = None
    if len(ws.running) > 1:
        # In the snapshot's order, as if loaded afresh.
        ws.running = {p.task: ws.running[p.task] for p in workload.placements}
    ws.started = {}
    ws.reason = None
    ws.original = dict(ws.running)


def _runs_as(ws: WorkloadState, workload: Workload) -> bool:
    """Whether `workload` has the same tasks, in the same queue, at the same priority and
    minimum (so as elastic), running where `ws` has."""
    old = ws.workload
    if old is not workload and (
        old.queue != workload.queue
        or old.task_groups != workload.task_groups
        or old.preemptible != workload.preemptible
        or old.priority != workload.priority
        or old.min_available != workload.min_available
        or old.node_selector != workload.node_selector
    ):
        return False
    running = ws.running
    if len(running) != len(workload.placements):
        return False
    for placement in workload.placements:
        now = running.get(placement.task)
        if now is not placement and now != placement:
            return False
    return True
