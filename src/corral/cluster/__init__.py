"""How the server reaches the node agents that run the work.

The scheduler loop writes every decision to the store first, then hands the changes to a
`Cluster`, which tells the agents concerned: start these tasks, stop those. Agents report
back (a task started, a task ended, the node is alive) through a `Reports` object that
the server provides. A reconciler compares what the store says should run on each node
with what its agent runs, so that a lost message or a restart heals by itself.

On one machine the agents run in the server's process (`corral.cluster.local`); on many
they are Ray actors. Without a cluster, decisions are recorded and nothing is started,
which is how the scheduler is tested and how a dry-run server behaves.

A cluster may also offer `rendezvous(workload, attempt, node) -> (address, port)`: rank
0's node address and a port its agent found free, for a gang's MASTER_ADDR and
MASTER_PORT (else a port free on the server's machine), `checkpoint_root`: storage
every node sees, where checkpoints go instead of the server's data directory, and
`forget(directory)`: a deleted workload's files go, on the server (its logs) and on every
node once its tasks there have gone (see corral.model.spec.directory_name).
"""

from __future__ import annotations

from typing import Protocol

from corral.messages import Reports, TaskLaunch, TaskStop

__all__ = ["Cluster", "Reports", "TaskLaunch", "TaskStop"]


class Cluster(Protocol):
    """The agents, as the server sees them."""

    def connect(self, reports: Reports) -> None:
        """Where the agents send their reports from now on."""

    def start(self, launches: list[TaskLaunch]) -> None:
        """Start (or adopt) tasks; starting a task that runs already changes nothing."""

    def stop(self, stops: list[TaskStop]) -> None:
        """Stop tasks; stopping a task that does not run changes nothing."""

    def running(self, node: str) -> set[tuple[str, int]] | None:
        """The (workload, task) pairs the node's agent runs or is stopping, or None when
        the node has no agent here."""

    def strays(self, node: str) -> set[tuple[str, int]]:
        """The (workload, task) pairs of processes the node's agent found running from
        before it started and nobody adopted (see corral.agent.strays)."""

    def close(self) -> None:
        """Stop talking to the agents (their tasks keep running)."""
