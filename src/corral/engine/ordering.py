"""Fairness order: which queue, and which workload in it, is served next.

Queues are chosen level by level from the root. Among siblings the order is:
1. a queue that stays within its deserved quota even with its candidate workload;
2. higher queue priority;
3. the smallest share of its allotment (the larger of deserved quota and fair share)
   counting the candidate workload, taking the dominant resource;
4. the older queue.
Within a leaf queue: higher workload priority, then a workload's minimum gang before the
growth of elastic workloads (fewest extra tasks first), then the older workload.

Keys change only for the queue that was just served and its ancestors, so each parent
keeps a heap of its children and entries are invalidated by version, not rebuilt.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator

from corral.engine.kinds import DIMENSIONS, GPU, Request
from corral.engine.state import Candidate, QueueState
from corral.model.resources import EPSILON

QueueKey = tuple[int, int, float, float, int]
# A candidate's place in its leaf queue: priority, growth, extra tasks, age, sequence.
Entry = tuple[int, int, int, float, int, Candidate]


def queue_key(queue: QueueState, request: Request) -> QueueKey:
    """The sort key of a queue among its siblings, with `request` added (see above)."""
    alloc = queue.alloc
    deserved = queue.deserved
    allotments = queue.allotment
    starved = True
    share = 0.0
    for resource in DIMENSIONS:
        amount = alloc[resource] + request[resource]
        if amount > deserved[resource] + EPSILON:
            starved = False
        allotment = allotments[resource]
        if math.isinf(allotment) or amount <= EPSILON:
            continue
        share = math.inf if allotment <= EPSILON else max(share, amount / allotment)
    return (0 if starved else 1, -queue.priority, share, alloc[GPU] + request[GPU], queue.age)


class FairOrder:
    """A hierarchical priority queue of candidates."""

    def __init__(self) -> None:
        # Only the queues with candidates, and their ancestors, take part: a busy cluster
        # has many queues and few with pending work.
        self._version: dict[str, int] = {}
        # Heaps of children keyed by the parent's name; "" is the root.
        self._children: dict[str, list[tuple[QueueKey, int, str, Request]]] = {"": []}
        self._leaves: dict[str, _Leaf] = {}
        self._sequence = 0

    def add(self, candidate: Candidate) -> None:
        """Queue a candidate; call `refresh` for its queue before the next `pop`."""
        workload = candidate.workload
        spec = workload.workload
        self._sequence += 1
        if candidate.growth:
            extra = len(workload.running) - spec.min_tasks
            entry = (-spec.priority, 1, extra, spec.submitted, self._sequence, candidate)
        else:
            entry = (-spec.priority, 0, 0, spec.submitted, self._sequence, candidate)
        leaf = self._leaves.get(workload.queue.name)
        if leaf is None:
            leaf = self._leaves[workload.queue.name] = _Leaf()
        leaf.push(entry)

    def take_alike(self, failed: Candidate) -> Iterator[Candidate]:
        """Take, one after another, the candidates next in `failed`'s queue that are alike
        it, up to the first that runs. Alike are minimum gangs that ask for the same tasks
        with the same priority, preemptibility and placement constraints (one
        `WorkloadState.alike_kind`): in one state, where one cannot be placed neither can
        the other, for the same reason. Only right after `failed` was tried and changed
        nothing: its queue's key is then as it was, so they are next in fairness order
        too, and each would fail as it did."""
        if failed.growth:
            return
        leaf = self._leaves[failed.workload.queue.name]
        kind = failed.workload.alike_kind()
        while (entry := leaf.first()) is not None:
            candidate = entry[-1]
            workload = candidate.workload
            if candidate.growth or workload.alike_kind() is not kind or workload.running:
                return
            leaf.drop(entry)
            yield candidate

    def refresh(self, leaf: QueueState) -> None:
        """Recompute the keys of `leaf` and its ancestors after it changed."""
        for queue in leaf.path:
            self._refresh(queue)

    def refresh_all(self, queues: list[QueueState]) -> None:
        """Compute the keys of every queue with candidates, and of its ancestors, deepest
        first (after adding candidates)."""
        involved = {
            level.name: level
            for queue in queues
            if queue.name in self._leaves
            for level in queue.path
        }
        for queue in sorted(involved.values(), key=lambda queue: -len(queue.path)):
            self._refresh(queue)

    def pop(self) -> Candidate | None:
        """The next candidate in fairness order. Call `refresh` for its queue afterwards."""
        heap = self._children[""]
        while True:
            self._clean(heap)
            if not heap:
                return None
            name = heap[0][2]
            if name in self._leaves:
                return self._leaves[name].pop()[-1]
            heap = self._children[name]

    def _refresh(self, queue: QueueState) -> None:
        name = queue.name
        version = self._version[name] = self._version.get(name, 0) + 1
        request: Request | None = None
        if queue.leaf:
            leaf = self._leaves.get(name)
            first = leaf.first() if leaf is not None else None
            if first is not None:
                request = first[-1].request
        else:
            heap = self._children.get(name)
            if heap:
                self._clean(heap)
                if heap:
                    request = heap[0][3]
        if request is None:
            return
        parent = queue.parent.name if queue.parent else ""
        heap = self._children.get(parent)
        if heap is None:
            heap = self._children[parent] = []
        heapq.heappush(heap, (queue_key(queue, request), version, name, request))

    def _clean(self, heap: list[tuple[QueueKey, int, str, Request]]) -> None:
        version = self._version
        while heap and heap[0][1] != version[heap[0][2]]:
            heapq.heappop(heap)


class InOrder:
    """Pending candidates in fairness order, each taken after the last one was tried
    (see `Session.pending_in_order`). Candidates that start running meanwhile are
    passed over."""

    def __init__(self, queues: list[QueueState], candidates: Iterable[Candidate]) -> None:
        self._order = FairOrder()
        for candidate in candidates:
            self._order.add(candidate)
        self._order.refresh_all(queues)
        self._last: Candidate | None = None

    def __iter__(self) -> InOrder:
        return self

    def __next__(self) -> Candidate:
        order = self._order
        if self._last is not None:
            order.refresh(self._last.workload.queue)
            self._last = None
        while (candidate := order.pop()) is not None:
            if not candidate.workload.running:
                self._last = candidate
                return candidate
            order.refresh(candidate.workload.queue)
        raise StopIteration

    def take_alike(self, failed: Candidate) -> Iterator[Candidate]:
        """The candidates next in `failed`'s queue that are alike it, taken (see
        `FairOrder.take_alike`); only right after `failed` was tried and changed nothing."""
        return self._order.take_alike(failed)


class _Leaf:
    """The candidates of one leaf queue in order. Most are added before the first pop,
    as the workloads come (oldest first): those are sorted once and taken from the
    front; the few added later (elastic growth) go to a heap. The next candidate is the
    lesser of the two heads."""

    __slots__ = ("later", "next", "ready", "sorted")

    def __init__(self) -> None:
        self.ready: list[Entry] = []
        self.next = 0
        self.sorted = False
        self.later: list[Entry] = []

    def push(self, entry: Entry) -> None:
        if self.sorted:
            heapq.heappush(self.later, entry)
        else:
            self.ready.append(entry)

    def first(self) -> Entry | None:
        """The next entry, left in place; None when there is none."""
        if not self.sorted:
            self.ready.sort()
            self.sorted = True
        later = self.later
        if self.next < len(self.ready):
            head = self.ready[self.next]
            return head if not later or head < later[0] else later[0]
        return later[0] if later else None

    def pop(self) -> Entry:
        """Take the next entry (there must be one)."""
        head = self.first()
        assert head is not None
        self.drop(head)
        return head

    def drop(self, head: Entry) -> None:
        """Take the next entry, `head`, as `first` just gave it."""
        if self.next < len(self.ready) and head is self.ready[self.next]:
            self.next += 1
        else:
            heapq.heappop(self.later)
