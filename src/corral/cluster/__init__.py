"""How the server reaches the node agents that run the work.

The scheduler loop writes every decision to the store first, then hands the changes to a
`Cluster`, which tells the agents concerned: start these tasks, stop those. Agents report
back (a task started, a task ended, the node is alive) through a `Reports` object that
the server provides. A reconciler compares what the store says should run on each node
with what its agent runs, so that a lost message or a restart heals by itself.

On one machine the agents run in the server's process (`corral.cluster.local`); on many
they are Ray actors. Without a cluster, decisions are recorded and nothing is started,
which is how the scheduler is tested and how a dry-run server behaves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from corral.model.telemetry import Sample


@dataclass(frozen=True, slots=True)
class TaskLaunch:
    """Everything an agent needs to start (or adopt) one task."""

    workload: str
    project: str
    task: int
    attempt: int
    node: str
    devices: tuple[int, ...]
    gpu: float
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    max_runtime: float | None = None
    # Seconds from SIGTERM to SIGKILL when the agent itself stops the task (max runtime).
    grace: float = 30.0
    # Set when the task already runs (after a restart): adopt it instead of starting it.
    pid: int | None = None
    proc_start: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.workload, self.task)


@dataclass(frozen=True, slots=True)
class TaskStop:
    """Stop some tasks of a workload on one node: SIGTERM, `grace` seconds, SIGKILL."""

    workload: str
    node: str
    tasks: tuple[int, ...]
    reason: str
    grace: float


class Reports(Protocol):
    """What agents tell the server. Calls may come from any thread."""

    def task_started(self, node: str, workload: str, task: int, pid: int, proc_start: int) -> None:
        """The task's process runs."""

    def task_ended(
        self, node: str, workload: str, task: int, exit_code: int | None, reason: str
    ) -> None:
        """The task's process is gone; `exit_code` None when nobody knows how it ended."""

    def heartbeat(self, node: str) -> None:
        """The node's agent is alive."""

    def samples(self, node: str, samples: list[Sample]) -> None:
        """The node's latest telemetry: one sample per device, or per task on a shared one."""


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

    def close(self) -> None:
        """Stop talking to the agents (their tasks keep running)."""
