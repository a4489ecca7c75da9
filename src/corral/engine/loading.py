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
from dataclasses import dataclass

from corral.engine.demand import Demand
from corral.engine.errors import SnapshotError
from corral.engine.fragmentation import Shape, task_shapes
from corral.engine.state import ClusterState, QueueState, WorkloadState
from corral.model import Snapshot, Workload

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
) -> dict[str, WorkloadState]:
    """The snapshot's workloads by name, oldest first, with their running tasks in
    `state`; `previous` (the kept workloads by name) is emptied."""
    # Kept work changes with the indices kept up to date; fresh work loads without.
    load = state.load if loading.fresh else state.add
    leaves = {name: queue for name, queue in queues.items() if queue.leaf}
    loaded: dict[str, WorkloadState] = {}
    for workload in sorted(snapshot.workloads, key=_SUBMITTED):
        name = workload.name
        ws = previous.pop(name, None)
        if ws is not None:
            unchanged = not ws.started and len(ws.running) == len(ws.original)
            if ws.workload is workload and unchanged and len(ws.running) < 2:
                # Given as last time (in a leaf queue then, and the queues are the same),
                # and the last cycle left it as it was (with one task or none, so in the
                # same order too): the common case, kept cheap.
                ws.reason = None
                loaded[name] = ws
                continue
        queue = leaves.get(workload.queue)
        if queue is None:
            raise SnapshotError(f"workload {name}: {workload.queue!r} is not a leaf queue")
        if name in loaded:
            raise SnapshotError(f"workload {name}: listed twice")
        if ws is not None:
            if _runs_as(ws, workload):
                if not unchanged:
                    # It started or shrank: its demand is worked out again.
                    _uncount(ws, loading)
                _carry_over(ws, workload)
                loaded[name] = ws
                continue
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
        loaded[name] = ws
    for gone in previous.values():
        _take_off(state, gone, loading)
    previous.clear()
    return loaded


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
