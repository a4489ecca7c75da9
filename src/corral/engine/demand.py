"""What each queue's work requests (GPU, CPU and memory), summed exactly.

Fair shares are divided by these totals. Added up in floating point, a total would
depend on the order of its terms; a Scheduler that keeps its state from cycle to cycle
adds and takes off terms as work comes and goes, in another order than a cycle loading
the same work afresh. So totals are the exact sums of their terms, rounded once: afresh
with `math.fsum`, and kept up as integers in units of the smallest float, 2**-1074. Both
round the same exact sum correctly, so they agree bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from corral.engine.kinds import CPU, GPU, MEMORY
from corral.engine.state import QueueState, WorkloadState

# Every finite float is a whole number of these units.
_SHIFT = 1074
_UNIT = 1 << _SHIFT


def _exact(value: float) -> int:
    """`value` in units of 2**-1074, exactly."""
    if value.is_integer():
        # Most requests are whole GPUs, cores and bytes (or none).
        return int(value) << _SHIFT
    numerator, denominator = value.as_integer_ratio()
    return numerator << (_SHIFT + 1 - denominator.bit_length())


def add_up(workloads: Iterable[WorkloadState], queues: Iterable[QueueState]) -> None:
    """Set each queue's `requested` to the exact sum of its workloads' demands (every
    workload's `demand` known), its descendants' included."""
    terms: dict[str, tuple[list[float], list[float], list[float]]] = {}
    for ws in workloads:
        gpu, cpu, memory = ws.demand or (0.0, 0.0, 0.0)
        for queue in ws.queue.path:
            found = terms.get(queue.name)
            if found is None:
                found = terms[queue.name] = ([], [], [])
            found[GPU].append(gpu)
            found[CPU].append(cpu)
            found[MEMORY].append(memory)
    for queue in queues:
        found = terms.get(queue.name)
        if found is not None:
            queue.requested[:] = [
                math.fsum(found[GPU]),
                math.fsum(found[CPU]),
                math.fsum(found[MEMORY]),
            ]


class Demand:
    """The exact sums of the demands of each queue's workloads (its descendants'
    included), kept up as workloads are counted and taken off (a workload is counted with
    its `demand` as it is then). The queues whose sums changed since the last
    `set_requested` are the only ones it sets again: a cycle costs what changed, not how
    many queues there are."""

    def __init__(self, workloads: Iterable[WorkloadState]) -> None:
        self._sums: dict[QueueState, list[int]] = {}
        # The queues to set again; None: every queue (nothing was set from these sums yet).
        self._changed: set[QueueState] | None = None
        for ws in workloads:
            self.count(ws)

    def count(self, ws: WorkloadState) -> None:
        """Add a workload's demand (which must be known) to its queues' sums."""
        self._change(ws, 1)

    def take_off(self, ws: WorkloadState) -> None:
        """Take off a counted workload's demand (as it was counted: call before changing it)."""
        self._change(ws, -1)

    def _change(self, ws: WorkloadState, sign: int) -> None:
        assert ws.demand is not None
        gpu, cpu, memory = ws.demand
        gpu_units, cpu_units, memory_units = _exact(gpu), _exact(cpu), _exact(memory)
        changed = self._changed
        for queue in ws.queue.path:
            sums = self._sums.get(queue)
            if sums is None:
                sums = self._sums[queue] = [0, 0, 0]
            sums[GPU] += sign * gpu_units
            sums[CPU] += sign * cpu_units
            sums[MEMORY] += sign * memory_units
            if changed is not None:
                changed.add(queue)

    def set_requested(self, queues: Iterable[QueueState]) -> bool:
        """Set the `requested` of each of `queues` (every queue of the tree) whose sums
        changed since the last call, or of every one on the first call; returns whether
        any queue's `requested` is not what it was."""
        changed = self._changed
        differs = False
        for queue in queues if changed is None else changed:
            total = self._sums.get(queue)
            if total is None:
                requested = [0.0, 0.0, 0.0]
            else:
                requested = [total[GPU] / _UNIT, total[CPU] / _UNIT, total[MEMORY] / _UNIT]
            if queue.requested != requested:
                queue.requested[:] = requested
                differs = True
        self._changed = set()
        return differs or changed is None
