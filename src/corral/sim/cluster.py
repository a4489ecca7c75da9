"""The cluster a simulation runs on: nodes, queues and scheduler settings, from a scenario
file or built for a study (uniform nodes, quotas in proportion to demand)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from corral.model import Node, Queue, SchedulerConfig, gpu_quota
from corral.scenario import Scenario
from corral.sim.errors import SimError
from corral.sim.trace import Trace


@dataclass(frozen=True, slots=True)
class Cluster:
    """Nodes, queues (projects and departments) and how the engine is configured."""

    name: str
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    config: SchedulerConfig = SchedulerConfig()

    @property
    def gpus(self) -> float:
        return float(sum(node.gpus for node in self.nodes if node.schedulable))

    def leaves(self) -> tuple[str, ...]:
        """Queues that may hold workloads (no queue names them as parent)."""
        parents = {queue.parent for queue in self.queues}
        return tuple(queue.name for queue in self.queues if queue.name not in parents)

    def quotas(self) -> dict[str, float]:
        """The deserved GPUs of each leaf queue."""
        deserved = {queue.name: queue.deserved.gpu for queue in self.queues}
        return {name: deserved[name] for name in self.leaves()}


def cluster_from_scenario(scenario: Scenario, trace: Trace) -> Cluster:
    """The scenario's nodes and queues; a scenario without nodes takes the trace's."""
    nodes = scenario.snapshot.nodes or trace.nodes
    if not nodes:
        raise SimError(
            scenario.source, "the scenario has no nodes and the trace describes no cluster"
        )
    return Cluster(scenario.name, nodes, scenario.snapshot.queues, scenario.config)


def check_projects(cluster: Cluster, trace: Trace, source: str) -> None:
    """Every project of the trace must have a leaf queue of the same name."""
    leaves = set(cluster.leaves())
    for project in trace.projects:
        if project not in leaves:
            known = ", ".join(sorted(leaves)) or "none"
            raise SimError(
                source,
                f'trace project "{project}" has no queue (leaf queues: {known})',
            )


def uniform_nodes(gpus: int, per_node: int = 8, prefix: str = "node") -> tuple[Node, ...]:
    """The fewest nodes of `per_node` GPUs holding at least `gpus` GPUs."""
    count = max(math.ceil(gpus / per_node), 1)
    width = len(str(count - 1))
    return tuple(Node(f"{prefix}{index:0{width}d}", gpus=per_node) for index in range(count))


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split `total` whole GPUs in proportion to `weights` (largest remainders; ties by name)."""
    weight_sum = sum(weights.values())
    if weight_sum <= 0:
        return dict.fromkeys(weights, 0)
    exact = {name: total * weight / weight_sum for name, weight in weights.items()}
    shares = {name: math.floor(value) for name, value in exact.items()}
    left = total - sum(shares.values())
    for name in sorted(exact, key=lambda name: (shares[name] - exact[name], name))[:left]:
        shares[name] += 1
    return shares


def project_queues(quotas: Mapping[str, float]) -> tuple[Queue, ...]:
    """One top-level queue per project with its deserved GPUs, in name order."""
    return tuple(Queue(name, deserved=gpu_quota(quotas[name])) for name in sorted(quotas))
