"""What users ask for: a workload submission and a node registration, as plain data."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.model.arrays import ArrayMember, Dependency
from corral.model.types import (
    DEFAULT_GRACE_PERIOD,
    DEFAULT_PRIORITY,
    Node,
    TaskGroup,
    Topology,
)


@dataclass(frozen=True, slots=True)
class PortSpec:
    """A port a workload's task listens on, reached through the server's proxy at
    /w/WORKLOAD/ (`main`) or /w/WORKLOAD/NAME/. The agent picks the number on the node.
    `base_url`: the program serves under that path itself (Jupyter's base_url), so the
    proxy passes the full path; otherwise it strips the /w/... prefix."""

    name: str
    base_url: bool = False


MAIN_PORT = "main"


def directory_name(workload: str, workload_id: int | None) -> str:
    """The name of a workload's own directories (its logs, its run files on a node, its
    workload directory with its checkpoints): NAME.ID, so that a workload that takes the
    name of a deleted one starts with none of its files (an id is never given twice, and a
    name holds no "."). `workload_id` None: a workload submitted before corral named them
    so, whose directories keep its name alone (its running tasks write there)."""
    return workload if workload_id is None else f"{workload}.{workload_id}"


def workload_of_directory(directory: str) -> str:
    """The name of the workload whose directories are named `directory`."""
    return directory.partition(".")[0]


# A workload's name (as the API takes it), then its id: what `directory_name` gives.
_DIRECTORY = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[0-9]{1,18})?$")


def is_directory_name(text: str) -> bool:
    """Whether `text` may name a workload's directories (`directory_name`): what a node
    or a message says is checked before it names a path."""
    return len(text) <= 90 and _DIRECTORY.match(text) is not None


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A submission: what to run, where it may run, and how it is scheduled."""

    name: str
    project: str
    user: str
    task_groups: tuple[TaskGroup, ...]
    priority: int = DEFAULT_PRIORITY
    preemptible: bool = True
    min_available: int | None = None
    node_selector: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    topology: Topology | None = None
    # Node pools it may run in, in order of preference; empty: any pool.
    node_pools: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # Environment variable -> name of a secret of the project (corral.store.secrets).
    secrets: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    max_runtime: float | None = None
    backoff_limit: int = 0
    grace_period: float = DEFAULT_GRACE_PERIOD
    # Workloads that must end (or succeed) first; a dependency that can no longer be met
    # cancels this one when `kill_on_invalid_dep`, else leaves it pending with the reason.
    after: tuple[Dependency, ...] = ()
    kill_on_invalid_dep: bool = False
    array: ArrayMember | None = None
    # Ports its tasks listen on (a workspace's); empty for most workloads.
    ports: tuple[PortSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class Device:
    index: int
    uuid: str
    model: str
    memory: int
    virtual: bool = False


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node as its agent (or an admin) registers it, with its devices."""

    node: Node
    devices: tuple[Device, ...] = ()
    virtual: bool = False
    # Where the server reaches the node's tasks (gang rendezvous, workspace ports); None
    # keeps what the store has (this machine's loopback for a new node).
    address: str | None = None
