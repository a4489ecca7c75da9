"""Plain data shared by every part of corral: resources, nodes, queues, workloads, decisions.

Nothing here knows about scheduling policy, storage or transport. Values are frozen,
slotted dataclasses so that a snapshot can be handed to the engine, the simulator and the
server without anyone mutating it behind the others' backs.
"""

from corral.model.queues import (
    LimitBelowDeserved,
    NegativeAmount,
    QueueCycle,
    QueueError,
    UnknownParent,
    check_quota,
    check_tree,
)
from corral.model.resources import (
    GIB,
    Resources,
    format_gpus,
    format_memory,
    gpu_quota,
    parse_memory,
)
from corral.model.types import (
    CLASS_ALIASES,
    DEFAULT_GRACE_PERIOD,
    DEFAULT_PRIORITY,
    PRIORITY_CLASSES,
    WORKLOAD_CLASSES,
    Decisions,
    Eviction,
    Node,
    Placement,
    Queue,
    QueueStatus,
    SchedulerConfig,
    Snapshot,
    TaskGroup,
    Topology,
    Workload,
    default_preemptible,
    resolve_priority,
)

__all__ = [
    "CLASS_ALIASES",
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_PRIORITY",
    "GIB",
    "PRIORITY_CLASSES",
    "WORKLOAD_CLASSES",
    "Decisions",
    "Eviction",
    "LimitBelowDeserved",
    "NegativeAmount",
    "Node",
    "Placement",
    "Queue",
    "QueueCycle",
    "QueueError",
    "QueueStatus",
    "Resources",
    "SchedulerConfig",
    "Snapshot",
    "TaskGroup",
    "Topology",
    "UnknownParent",
    "Workload",
    "check_quota",
    "check_tree",
    "default_preemptible",
    "format_gpus",
    "format_memory",
    "gpu_quota",
    "parse_memory",
    "resolve_priority",
]
