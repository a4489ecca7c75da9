"""The scheduling engine: one pure, deterministic cycle over a snapshot.

`schedule(snapshot, config)` returns the decisions of one cycle; `apply_decisions`
gives the snapshot that follows from them. The server, the simulator and `corral plan`
all call these two functions.
"""

from corral.engine.cycle import apply_decisions, schedule
from corral.engine.fairshare import Claim, divide, divide_tree

__all__ = ["Claim", "apply_decisions", "divide", "divide_tree", "schedule"]
