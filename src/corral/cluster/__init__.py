"""How the server reaches the node agents that run the work.

The scheduler loop writes every decision to the store first, then hands the changes to a
`Cluster`, which tells the agents concerned: start these tasks, stop those. Agents report
back through the store. On one machine the agents run in the server's process; on many,
they are Ray actors. Without a cluster, decisions are recorded and nothing is started,
which is how the scheduler is tested and how a dry-run server behaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from corral.model import Eviction, Placement


@dataclass(frozen=True, slots=True)
class Changes:
    """What one scheduling cycle changed, for the agents."""

    started: dict[str, tuple[Placement, ...]]
    stopped: tuple[Eviction, ...]


class Cluster(Protocol):
    """The agents, as the server sees them."""

    def dispatch(self, changes: Changes) -> None:
        """Start and stop tasks as the cycle decided; must not block for long."""

    def stop_workload(self, workload: str, reason: str) -> None:
        """Stop every task of a workload that was deleted or suspended."""

    def close(self) -> None:
        """Stop talking to the agents (their tasks keep running)."""
