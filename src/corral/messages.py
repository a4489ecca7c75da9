"""The messages between the server and the node agents.

They live below both `corral.agent` and `corral.cluster`, so that the arrows run one way:
a transport (`corral.cluster`) builds and calls agents, and both speak these types. A
message must survive being sent twice or lost: starting a task that runs already and
stopping one that does not run change nothing, and the reconciler resends what is missing.

Nor may order be trusted: the server decides in several threads, and a transport may
deliver two orders in the other order (a Ray agent is a threaded actor). So each order
carries when it was decided, by the server's clock: a launch, the time after its bound
task was read from the store; a stop, the time before the store was read (or written)
that decided it. A stop decided before the launch of the task it finds is about an
earlier binding (the task was requeued and bound again meanwhile), and the agent leaves
the task alone. A stop so skipped that was meant for the task after all is decided
again, later, by the reconciler's next pass. The server's wall clock, not a counter of
the store: it goes on across restarts of the server and a new database alike (a step
back of the clock spares, for as long as the step, stops it should not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from corral.model import DEFAULT_GRACE_PERIOD
from corral.model.spec import NodeSpec, PythonEnv
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
    grace: float = DEFAULT_GRACE_PERIOD
    # Set when the task already runs (after a restart): adopt it instead of starting it.
    pid: int | None = None
    proc_start: int | None = None
    # The Unix account the task runs as when the agent runs as root (its submitter's);
    # None when the submitter has none, and such a task is refused by a root agent.
    unix_user: str | None = None
    # Which binding of the task this is: an end reported for another launch of the same
    # task (evicted and bound again while its workload kept running) is not this one's.
    launch: int | None = None
    # Names of the ports the task listens on: the agent picks a free number for each on
    # its node, gives it as CORRAL_PORT / CORRAL_PORT_<NAME> and reports it (task_ports).
    ports: tuple[str, ...] = ()
    # When the server read this binding (see above); None: unknown.
    decided_at: float | None = None
    # The name of the workload's own directories on the node (its log, its run files, its
    # workload directory: corral.model.spec.directory_name), NAME.ID: a later workload of
    # the same name never finds them. Left out (a server of before): the workload's name.
    directory: str = ""
    # What the task asked for (its task group's request): CPU cores and memory in bytes,
    # 0 when it gave none. The agent makes them the limits of the task's cgroup.
    cpu: float = 0.0
    memory: int = 0
    # What the task brings (corral.model.spec.WorkloadSpec): the digest of its project's
    # code snapshot, which it starts in a private copy of (`workdir` then is taken from
    # the copy); the Python environment the agent builds for it; the image it runs in.
    code: str | None = None
    python: PythonEnv | None = None
    image: str | None = None

    def __post_init__(self) -> None:
        if not self.directory:
            object.__setattr__(self, "directory", self.workload)

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
    # When the server began to read what decided the stop (see above); None: stop
    # whatever runs.
    decided_at: float | None = None

    def spares(self, launch: TaskLaunch) -> bool:
        """Whether `launch` was decided after this stop: not the task it is for."""
        return (
            self.decided_at is not None
            and launch.decided_at is not None
            and launch.decided_at > self.decided_at
        )


# Why a task ended when corral ended it, as its end reports it (`Reports.task_ended`); an
# end without a cause is the workload's own (its exit code says how). An end corral caused
# is never counted against the workload: its gang is requeued as after a preemption.
STOPPED = "stopped"  # an order of the server's (a preemption, a lost peer's gang, ...)
FENCED = "fenced"  # its node was cut off from the cluster, or declared lost
CAUSES = (STOPPED, FENCED)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """The server's settings that agents follow, sent on every (re)connection, so that a
    restarted server with new settings reaches agents that outlived the old one."""

    # Tasks of a node cut off from the cluster (its agent reaches neither the server nor
    # Ray) stop after this many seconds: before the server, after its loss timeout, may
    # start them anywhere else.
    fence_timeout: float = 4.0
    # A node whose agent has not answered for this long is declared lost.
    loss_timeout: float = 10.0
    # While the agent still reaches the cluster, its tasks keep running this long without
    # a word from the server (a server restarting, upgraded, or down for a while).
    server_absence: float = 600.0
    # How long a drain waits for a report before it answers with what runs.
    poll_interval: float = 1.0
    # The walls of every task (corral.agent.walls.WallOptions): the most of its output
    # kept on disk, the most processes it may have, and whether it gets a cgroup and a
    # process namespace at all (on a root agent). A change of the first two reaches the
    # tasks started after it.
    log_cap: int = 1 << 30
    task_pids: int = 4096
    task_limits: bool = True
    # The addresses the server connects from (its host's): the one place outside a node
    # from where the ports given to its tasks answer (corral.agent.portwall).
    server_addresses: tuple[str, ...] = ()
    # Where the nodes' Python environments take packages from besides what a workload
    # gives (corral.agent.prepare.NodeIndex): an index instead of PyPI, and find-links.
    index_url: str | None = None
    find_links: tuple[str, ...] = ()


class Reports(Protocol):
    """What agents tell the server. Calls may come from any thread."""

    def task_started(self, node: str, workload: str, task: int, pid: int, proc_start: int) -> None:
        """The task's process runs."""

    def task_ended(
        self,
        node: str,
        workload: str,
        task: int,
        exit_code: int | None,
        reason: str,
        attempt: int | None = None,
        launch: int | None = None,
        cause: str | None = None,
        directory: str | None = None,
    ) -> None:
        """The task's process is gone; `exit_code` None when nobody knows how it ended.
        `attempt` and `launch` are those the process was launched with (`TaskLaunch`): the
        end of an earlier attempt, or of an earlier launch of the task in this attempt, is
        not the end of the task bound now. `cause` is one of CAUSES when corral ended it,
        None when it ended by itself. `directory` is the launch's too: the end of a deleted
        workload's task is not that of a later workload of the same name (None: an agent
        of before, which does not say)."""

    def task_ports(self, node: str, workload: str, task: int, ports: Mapping[str, int]) -> None:
        """The port numbers the agent gave the task's declared ports, by name."""

    def task_preparing(self, node: str, workload: str, task: int, what: str) -> None:
        """The task has not started yet because the agent prepares what it brings (its
        code, its Python environment, its image): `what` says how far it is, as a person
        reads it ("building environment: 7 of 12 packages"). An agent of before sends
        none."""

    def code(self, project: str, digest: str) -> bytes:
        """The bytes of the code snapshot `digest` of `project` (its .tar.gz), which a task
        about to start on the node brings; LookupError when the server has none. (Asked,
        not told: of the transports, only the in-process one calls it; Ray's sends the
        snapshots with the launches.)"""
        raise NotImplementedError

    def heartbeat(self, node: str) -> None:
        """The node's agent is alive."""

    def node_joined(self, spec: NodeSpec) -> None:
        """A node's agent came up and found these devices: the node is registered, or
        registered again with its work kept (a restarted agent, a new server)."""

    def checkpoints(self, node: str, times: Mapping[str, float]) -> None:
        """The newest checkpoint (Unix time) of workloads running on the node, by name, for
        those whose checkpoint is newer than the node's agent last said. An agent of
        before this message sends none."""

    def samples(self, node: str, samples: list[Sample]) -> None:
        """The node's latest telemetry: one sample per device, or per task on a shared one."""
