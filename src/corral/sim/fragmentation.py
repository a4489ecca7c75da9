"""The fragmentation protocol of "Beware of Fragmentation" (USENIX ATC'23), on the
Alibaba 2023 ("openb") trace.

Pods are sampled with replacement from a pod list until their GPU requests add up to
130% of the cluster's GPUs, shuffled, and placed one by one, never leaving. The figure
of merit is the share of the cluster's GPUs still unallocated when the GPUs asked for
by the pods that arrived first reach 100% of capacity: a perfect packer would leave
only what the pods that could not fit anywhere left.

`corral` places with the engine itself: one `schedule()` over all pods in one queue, in
arrival order, allocating only. The engine serves one queue oldest first and places
each workload greedily on the state the earlier ones left, so one cycle is exactly the
one-by-one protocol. The other policies use the scorers of `corral.sim.packing`; `fgd` is
the paper's own policy as we implemented it from its description, weighing the kinds of
task in the pods being placed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from corral.engine import schedule
from corral.model import Node, Queue, SchedulerConfig, Snapshot, Workload, gpu_quota
from corral.sim.loaders.alibaba import Pod
from corral.sim.packing import (
    SCORERS,
    FragmentationGradient,
    PackingState,
    Scorer,
    place_group,
)

Floats = npt.NDArray[np.float64]

# `fgd` is our implementation of the paper's own policy (FragmentationGradient).
FGD_POLICIES = ("corral", *SCORERS, "fgd")
TARGET = 1.3


@dataclass(frozen=True, slots=True)
class FragmentationRun:
    """After each pod, in order: GPUs asked for so far and GPUs allocated so far."""

    policy: str
    capacity: float
    arrived: Floats
    allocated: Floats
    seconds: float

    def unallocated_at(self, level: float = 1.0) -> float:
        """Share of capacity unallocated when arrived demand first reaches `level`."""
        reached = np.flatnonzero(self.arrived >= level * self.capacity - 1e-9)
        at = int(reached[0]) if reached.size else len(self.arrived) - 1
        return float(1.0 - self.allocated[at] / self.capacity)


def sample_pods(pods: Sequence[Pod], capacity: float, seed: int) -> list[Pod]:
    """Pods drawn with replacement until their GPU requests reach 130% of `capacity`,
    in random order."""
    rng = np.random.default_rng(seed)
    requests = np.array([pod.gpu for pod in pods])
    if requests.sum() <= 0:
        raise ValueError("the pod list asks for no GPUs")
    drawn: list[int] = []
    total = 0.0
    while total < TARGET * capacity:
        batch = rng.integers(0, len(pods), size=1024)
        for index in batch:
            drawn.append(int(index))
            total += requests[index]
            if total >= TARGET * capacity:
                break
    order = rng.permutation(len(drawn))
    return [pods[drawn[at]] for at in order]


def run_fragmentation(
    nodes: Sequence[Node], pods: Sequence[Pod], policy: str, seed: int = 0
) -> FragmentationRun:
    """Place `pods` in order under `policy` (see FGD_POLICIES)."""
    capacity = float(sum(node.gpus for node in nodes))
    began = time.perf_counter()
    if policy == "corral":
        placed = _engine_placed(nodes, pods, capacity)
    elif policy in SCORERS or policy == "fgd":
        placed = _scorer_placed(nodes, pods, policy, seed)
    else:
        raise ValueError(f"unknown placement policy {policy!r}; expected one of {FGD_POLICIES}")
    seconds = time.perf_counter() - began
    requests = np.array([pod.gpu for pod in pods])
    return FragmentationRun(
        policy=policy,
        capacity=capacity,
        arrived=np.cumsum(requests),
        allocated=np.cumsum(np.where(placed, requests, 0.0)),
        seconds=seconds,
    )


def _engine_placed(nodes: Sequence[Node], pods: Sequence[Pod], capacity: float) -> list[bool]:
    # The pool deserves everything, so no quota stands in the way of any pod.
    queue = Queue("pool", deserved=gpu_quota(capacity))
    workloads = tuple(
        Workload(
            name=f"pod{index:06d}",
            queue="pool",
            task_groups=(pod.task_group(),),
            node_selector={"gpu_model": pod.gpu_models} if pod.gpu_models else {},
            submitted=float(index),
        )
        for index, pod in enumerate(pods)
    )
    decisions = schedule(
        Snapshot(tuple(nodes), (queue,), workloads), SchedulerConfig(actions=("allocate",))
    )
    return [workload.name in decisions.bindings for workload in workloads]


def _scorer_placed(
    nodes: Sequence[Node], pods: Sequence[Pod], policy: str, seed: int
) -> list[bool]:
    state = PackingState(nodes)
    state.rng = np.random.default_rng(seed)
    state.random_devices = policy == "random"
    scorer: Scorer
    if policy == "fgd":
        scorer = FragmentationGradient.of([pod.task_group() for pod in pods])
    else:
        scorer = SCORERS[policy]
    return [
        place_group(state, scorer, (pod.task_group(),), pod.gpu_models) is not None for pod in pods
    ]
