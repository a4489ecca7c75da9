"""The engine's vocabulary: resource dimensions, and the kinds of action and eviction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, get_args

# GPU, CPU and memory amounts travel as triples (and lists of three) indexed by these.
GPU: Final = 0
CPU: Final = 1
MEMORY: Final = 2
DIMENSIONS: Final = (GPU, CPU, MEMORY)

# GPU, CPU and memory asked for by some tasks.
Request = tuple[float, float, float]

# The actions a cycle may run, in their usual order (`SchedulerConfig.actions`).
ActionName = Literal["allocate", "consolidate", "reclaim", "preempt"]
ACTION_NAMES: Final[tuple[ActionName, ...]] = get_args(ActionName)

# The actions that evict (`Eviction.action`), and how a pending reason says it was done.
EvictionKind = Literal["consolidate", "reclaim", "preempt"]
EVICTED: Final[Mapping[EvictionKind, str]] = {
    "consolidate": "moved",
    "reclaim": "reclaimed",
    "preempt": "preempted",
}
