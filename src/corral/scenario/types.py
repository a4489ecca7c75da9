"""What a scenario file says, once read and checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from corral.model import SchedulerConfig, Snapshot

UNTIL_STABLE: Final = "until-stable"
# Bounds an until-stable run, so a scheduler that keeps changing its mind still stops.
MAX_CYCLES: Final = 20

Cycles = int | Literal["until-stable"]


@dataclass(frozen=True, slots=True)
class RunningExpectation:
    """Where a workload must end up running.

    `node` set: every running task is on that node. `nodes` set: the multiset of nodes of
    the running tasks, one entry per task. Neither: running anywhere.
    """

    node: str | None = None
    nodes: tuple[str, ...] | None = None

    def describe(self) -> str:
        if self.node is not None:
            return f"running on {self.node}"
        if self.nodes is not None:
            return f"running on [{', '.join(self.nodes)}]"
        return "running"


@dataclass(frozen=True, slots=True)
class Expectations:
    """The `expect` section. Workloads not named in `running` must end pending."""

    running: Mapping[str, RunningExpectation] = field(default_factory=dict)
    pending: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    same_gpu: tuple[tuple[str, ...], ...] = ()
    # Pending workloads expected to hold a reservation at the end, and its nodes.
    reserved: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A cluster at one moment, how to run the scheduler on it, and what should happen.

    `source` is the file the scenario was read from, for messages.
    """

    name: str
    description: str
    config: SchedulerConfig
    cycles: Cycles
    snapshot: Snapshot
    expectations: Expectations | None
    source: str
