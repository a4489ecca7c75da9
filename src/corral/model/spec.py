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


# A code snapshot is named by its digest: "sha256:" and the hex of its .tar.gz's hash.
DIGEST_PREFIX = "sha256:"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"


# The label of a node whose agent runs tasks in images (corral.agent.containers), which a
# workload with an image selects.
CONTAINERS_LABEL = "corral.io/containers"
CONTAINERS_VALUE = "podman"


@dataclass(frozen=True, slots=True)
class PythonEnv:
    """A Python environment a node builds for a workload's tasks with uv, and shares with
    every workload that asks for the same one: the files that say what to install (by
    name: `requirements.txt`; or `pyproject.toml`, with `uv.lock` when it has one), the
    Python version (None: the node's), and where packages come from besides the index the
    node is configured with."""

    files: tuple[tuple[str, str], ...]
    version: str | None = None
    index_url: str | None = None
    find_links: tuple[str, ...] = ()


# A workload is PROJECT/NAME: its name is unique within its project, and the key that
# names it everywhere inside corral (the store, the engine's decisions, the messages to
# agents, /w/PROJECT/NAME/ in the proxy) is its project and name with this between them.
# A workload submitted before names were per project keeps its bare NAME as its key.
KEY_SEPARATOR = "/"
# In a directory's name a key's separator is written as this (no name holds it).
_DIRECTORY_SEPARATOR = "_"


def workload_key(project: str, name: str) -> str:
    """The key of workload `name` of `project`: PROJECT/NAME."""
    return f"{project}{KEY_SEPARATOR}{name}"


def short_name(key: str) -> str:
    """The name of a workload within its project, from its key (a key of before names
    were per project is its name)."""
    return key.rpartition(KEY_SEPARATOR)[2]


def split_key(text: str) -> tuple[str | None, str]:
    """(project, name) of PROJECT/NAME, or (None, NAME) of a bare name."""
    project, separator, name = text.rpartition(KEY_SEPARATOR)
    return (project, name) if separator else (None, name)


def directory_name(workload: str, workload_id: int | None) -> str:
    """The name of a workload's own directories (its logs, its run files on a node, its
    workload directory with its checkpoints): PROJECT_NAME.ID, so that a workload that
    takes the name of a deleted one starts with none of its files (an id is never given
    twice; a name holds no "." nor "_"). `workload_id` None: a workload submitted before
    corral named them so, whose directories keep its name alone (its running tasks write
    there)."""
    flat = workload.replace(KEY_SEPARATOR, _DIRECTORY_SEPARATOR)
    return flat if workload_id is None else f"{flat}.{workload_id}"


def workload_of_directory(directory: str) -> str:
    """The key of the workload whose directories are named `directory`."""
    return directory.partition(".")[0].replace(_DIRECTORY_SEPARATOR, KEY_SEPARATOR)


# A workload's key (PROJECT_NAME, or a bare NAME of before), then its id: what
# `directory_name` gives.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DIRECTORY = re.compile(rf"^({_LABEL}_)?{_LABEL}(\.[0-9]{{1,18}})?$")


def is_directory_name(text: str) -> bool:
    """Whether `text` may name a workload's directories (`directory_name`): what a node
    or a message says is checked before it names a path."""
    return len(text) <= 160 and _DIRECTORY.match(text) is not None


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
    # What its tasks bring to whichever node they land on (docs/workloads.md): a code
    # snapshot of its project (its digest), which each task starts in a private copy of; a
    # Python environment the node builds; an OCI image the task runs in.
    code: str | None = None
    python: PythonEnv | None = None
    image: str | None = None


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
