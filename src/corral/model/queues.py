"""The rules a queue tree obeys, as pure checks shared by the store, the scenario loader
and the engine: amounts are 0 or more, a limit is not below what the queue deserves, every
parent exists, and no queue is its own ancestor.

Each check raises a typed `QueueError` naming the queue and the field; callers word the
message for their own users (an API field, a scenario path, an engine error).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from corral.model.resources import EPSILON, Resources
from corral.model.types import Queue


class QueueError(ValueError):
    """A queue breaks a rule of the tree. `field` is the queue's field at fault
    (`parent`, `limit.gpu`, `deserved.cpu`...), `message` a plain wording of what is wrong."""

    def __init__(self, queue: str, field: str, message: str) -> None:
        super().__init__(f"queue {queue}: {field}: {message}")
        self.queue = queue
        self.field = field
        self.message = message


class NegativeAmount(QueueError):
    """A deserved amount, a limit or an over-quota weight is below 0."""

    def __init__(self, queue: str, field: str) -> None:
        super().__init__(queue, field, "must be 0 or more")


class LimitBelowDeserved(QueueError):
    """The queue's limit of `resource` is below the amount it deserves."""

    def __init__(self, queue: str, resource: str, limit: float, deserved: float) -> None:
        super().__init__(queue, f"limit.{resource}", f"{limit:g} is below deserved {deserved:g}")
        self.resource = resource
        self.limit = limit
        self.deserved = deserved


class UnknownParent(QueueError):
    """The queue names a parent that is not in the tree."""

    def __init__(self, queue: str, parent: str) -> None:
        super().__init__(queue, "parent", f'unknown queue "{parent}"')
        self.parent = parent


class QueueCycle(QueueError):
    """Following parents from `queue` comes back to it: `cycle` lists the queues in order,
    starting with `queue`."""

    def __init__(self, cycle: tuple[str, ...]) -> None:
        super().__init__(cycle[0], "parent", f"cycle {' -> '.join([*cycle, cycle[0]])}")
        self.cycle = cycle


def check_quota(queue: Queue) -> None:
    """Raise NegativeAmount or LimitBelowDeserved for the first resource (in
    `Resources.NAMES` order) whose amounts break a rule. An unmanaged (infinite) deserved
    amount leaves the limit free; a limit within EPSILON below deserved is accepted, so that
    amounts that went through arithmetic compare as they were meant."""
    for resource in Resources.NAMES:
        deserved = queue.deserved.get(resource)
        limit = queue.limit.get(resource)
        if deserved < 0:
            raise NegativeAmount(queue.name, f"deserved.{resource}")
        if limit < 0:
            raise NegativeAmount(queue.name, f"limit.{resource}")
        if queue.over_quota_weight.get(resource) < 0:
            raise NegativeAmount(queue.name, f"over_quota_weight.{resource}")
        if math.isfinite(deserved) and limit < deserved - EPSILON:
            raise LimitBelowDeserved(queue.name, resource, limit, deserved)


def check_tree(queues: Sequence[Queue]) -> None:
    """Raise UnknownParent for the first queue (in the order given) whose parent is
    missing, else QueueCycle for the first cycle found. A cycle starts with the member
    listed first, so that the error does not depend on where the walk entered it."""
    position = {queue.name: index for index, queue in enumerate(queues)}
    parents = {queue.name: queue.parent for queue in queues}
    for queue in queues:
        if queue.parent is not None and queue.parent not in parents:
            raise UnknownParent(queue.name, queue.parent)
    for queue in queues:
        trail = [queue.name]
        parent = queue.parent
        while parent is not None:
            if parent in trail:
                cycle = trail[trail.index(parent) :]
                start = min(range(len(cycle)), key=lambda at: position[cycle[at]])
                raise QueueCycle(tuple(cycle[start:] + cycle[:start]))
            trail.append(parent)
            parent = parents[parent]
