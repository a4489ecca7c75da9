"""The actions of a scheduling cycle, one module each, run in order on one Session:
allocate, consolidate, reclaim, preempt. Each is a small class whose `run()` is its one
entry point; the simulator asks the cheap `could_...` checks whether a cycle is worth
running at all."""

from corral.engine.actions.allocate import Allocate
from corral.engine.actions.consolidate import Consolidate
from corral.engine.actions.preempt import Preempt
from corral.engine.actions.reclaim import Reclaim

__all__ = ["Allocate", "Consolidate", "Preempt", "Reclaim"]
