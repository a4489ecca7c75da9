"""When could a pending workload start? (`corral list --start`, like `squeue --start`.)

Pure: a snapshot and the times at which running workloads will end (by their maximum
runtime) in, a time or None out. The answer is the end of the running workload after
which one allocation cycle would place it, with everything that waits ahead of it
(higher priority, or as high and older) still waiting; None when that depends on work
whose end is unknown, or it would not fit even once every known end has passed.
It assumes that nothing new arrives and that the work ahead does not start first, so it
is an estimate, as Slurm's is.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.engine.cycle import schedule
from corral.model import SchedulerConfig, Snapshot, Workload

# Only allocation: what reclaim or preemption could free, a cycle would have freed already.
_ALLOCATE = SchedulerConfig(actions=("allocate",))


def estimate_start(
    snapshot: Snapshot, name: str, ends: Mapping[str, float], now: float
) -> float | None:
    """The estimated start of the pending workload `name` of `snapshot`: `now` when a
    cycle would place it at once, else the end (from `ends`, by running workload) after
    which it would fit, or None when that cannot be known. KeyError when `name` is not a
    pending workload of the snapshot."""
    target = next((w for w in snapshot.workloads if w.name == name and not w.placements), None)
    if target is None:
        raise KeyError(name)
    running = [w for w in snapshot.workloads if w.placements]
    ahead = tuple(w for w in snapshot.workloads if not w.placements and _before(w, target))
    known = sorted((ends[w.name], w.name) for w in running if w.name in ends)

    def fits(ended: int) -> bool:
        gone = {workload for _, workload in known[:ended]}
        trial = Snapshot(
            snapshot.nodes,
            snapshot.queues,
            tuple(w for w in running if w.name not in gone) + ahead + (target,),
        )
        return name in schedule(trial, _ALLOCATE).bindings

    if fits(0):
        return now
    if not known or not fits(len(known)):
        return None
    # Fewer ends never free more: the first count of ends that fits, by bisection.
    low, high = 1, len(known)
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return max(now, known[low - 1][0])


def _before(other: Workload, target: Workload) -> bool:
    """Whether `other` waits ahead of `target`: higher priority, or as high and older."""
    if other.name == target.name:
        return False
    return (-other.priority, other.submitted, other.name) < (
        -target.priority,
        target.submitted,
        target.name,
    )
