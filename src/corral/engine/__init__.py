"""The scheduling engine: one pure, deterministic cycle over a snapshot.

`schedule(snapshot, config)` returns the decisions of one cycle; `apply_decisions`
gives the snapshot that follows from them; `corral plan` calls these two functions. A
`Scheduler` is `schedule` for a run of snapshots of one cluster that keeps the state of
running work from one cycle to the next (the server's scheduler loop and the simulator
use it); its decisions are the same. Input the engine must refuse raises an EngineError
(a ValueError): a SnapshotError or a ConfigError.
"""

from corral.engine.cycle import Scheduler, apply_decisions, decided, schedule
from corral.engine.errors import ConfigError, EngineError, SnapshotError
from corral.engine.fairshare import Claim, divide, divide_tree

__all__ = [
    "Claim",
    "ConfigError",
    "EngineError",
    "Scheduler",
    "SnapshotError",
    "apply_decisions",
    "decided",
    "divide",
    "divide_tree",
    "schedule",
]
