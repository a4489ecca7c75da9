"""Honest refusals: a submission that can never run on the cluster as it is is refused at
once (422 naming the field), rather than left pending for ever, as Slurm refuses a job no
partition can hold: growing the cluster or a limit is an operator's act, after which the
work is submitted again. What "never" means is the engine's rule
(`corral.engine.admission`); this module finds the shape of the cluster to check against,
from the scheduler's last cycle or the store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from corral.engine.admission import Shape, Summary
from corral.model.spec import WorkloadSpec
from corral.store import Invalid, Store


class Admission:
    """Checks submissions against the cluster's shape. The shape is the one the scheduler's
    last cycle saw, in memory; since a node or a queue may have changed after it, a refusal
    is made only once the store, read afresh, confirms it (refusals are rare, so the
    common path reads nothing). Without a cycle yet (or on a server that runs no
    scheduler), or when none of the last cycle's nodes match the workload (in one of the
    node pools it names) or its project is newer than that cycle, the store is read, again
    only when its generation moved. What the nodes hold is summed up once per shape, node
    selector and pools (`Capacity`), so that a check costs the same on 10 nodes as on
    10,000."""

    def __init__(self, store: Store, kept: Callable[[], Shape | None] = lambda: None) -> None:
        self.store = store
        self.kept = kept
        self._lock = threading.Lock()
        self._cached: tuple[int, Shape] | None = None
        # The summaries of the last shapes seen (the kept one and the store's).
        self._summaries: list[Summary] = []

    def shape(self) -> Shape:
        """The nodes and queues as of the store's current generation."""
        generation = self.store.generation
        cached = self._cached
        if cached is not None and cached[0] == generation:
            return cached[1]
        with self._lock:
            shape = self.store.cluster_shape()
            self._cached = (generation, shape)
            return shape

    def accepts(self, spec: WorkloadSpec) -> bool:
        """True when the last cycle's shape, in memory, holds `spec` (it may run there);
        False when only `check` can tell (it may read the store). Reads nothing, so it
        may run on the event loop."""
        kept = self.kept()
        if kept is None:
            return False
        summary = self._summary(kept)
        # When none of its nodes match (in some pool it names), or its project is newer
        # than that cycle, the store is asked.
        return (
            spec.project in summary.queues
            and summary.matches(spec)
            and summary.never_fits(spec) is None
        )

    def check(self, spec: WorkloadSpec) -> None:
        """Raise Invalid when `spec` can never run here."""
        self.check_all([spec], None)

    def check_all(self, specs: Sequence[WorkloadSpec], at: str | None = "workloads") -> None:
        """Raise Invalid for the first of `specs` that can never run here, at its place
        in the request (`workloads[i]`; at the top when `at` is None). The store is read
        once at most, whatever their number: a batch of a thousand checked one by one
        read its generation a thousand times."""
        shape: Shape | None = None
        for index, spec in enumerate(specs):
            if self.accepts(spec):
                continue
            if shape is None:
                shape = self.shape()
            problem = self._summary(shape).never_fits(spec)
            if problem is not None:
                path, message = problem
                place = () if at is None else (at, index)
                raise Invalid(str(path[-1]), message, (*place, *path[:-1]))

    def _summary(self, shape: Shape) -> Summary:
        # The scheduler's cycles hand on the same tuples while nodes and queues stay.
        for summary in self._summaries:
            if summary.shape[0] is shape[0] and summary.shape[1] is shape[1]:
                return summary
        summary = Summary(shape)
        # Two: the kept shape and the store's, which alternate when they differ.
        self._summaries = [summary, *self._summaries[:1]]
        return summary
