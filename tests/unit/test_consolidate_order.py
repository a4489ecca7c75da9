"""The nodes consolidation tries to make room on, in the order it tries them: the most
free GPUs first, then the node whose newest movable work is newest, then by index; at
most `consolidate_max_nodes` of them. The order is worked out lazily, one level of free
capacity at a time; these compare it with every node ranked outright."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine.actions.consolidate import Consolidate
from corral.engine.cycle import Cycle
from corral.model import Node, Placement, Queue, SchedulerConfig, Snapshot, TaskGroup, Workload

GPUS = 4

# Per node: the running workloads on it, each (GPUs, preemptible, submitted).
nodes_work = st.lists(
    st.lists(
        st.tuples(st.integers(1, 2), st.booleans(), st.integers(0, 5)),
        max_size=3,
    ),
    min_size=1,
    max_size=12,
)


def snapshot_of(work: list[list[tuple[int, bool, int]]]) -> Snapshot:
    nodes = tuple(Node(f"n{index}", gpus=GPUS) for index in range(len(work)))
    workloads = []
    for index, on_node in enumerate(work):
        device = 0
        for gpus, preemptible, submitted in on_node:
            if device + gpus > GPUS:
                break
            placement = Placement(0, f"n{index}", tuple(range(device, device + gpus)), gpus)
            device += gpus
            workloads.append(
                Workload(
                    f"w{index}-{device}",
                    "q",
                    (TaskGroup(gpu=float(gpus)),),
                    preemptible=preemptible,
                    submitted=float(submitted),
                    placements=(placement,),
                )
            )
    return Snapshot(nodes, (Queue("q"),), tuple(workloads))


@settings(max_examples=200, deadline=None)
@given(nodes_work, st.integers(0, 14))
def test_nodes_come_most_free_first_then_newest_movable_work_then_index(
    work: list[list[tuple[int, bool, int]]], most: int
) -> None:
    cycle = Cycle(snapshot_of(work), SchedulerConfig())
    consolidate = Consolidate(cycle.session)
    nodes = list(cycle.session.state.nodes)

    def newest_movable(name: str) -> float:
        on_node = cycle.session.by_node.get(name, [])
        return max(
            (ws.workload.submitted for ws in on_node if ws.workload.preemptible),
            default=-math.inf,
        )

    ranked = sorted(
        nodes, key=lambda node: (-node.free_gpu, -newest_movable(node.name), node.index)
    )
    tried = [node.name for node in consolidate._first_nodes(nodes, most)]
    assert tried == [node.name for node in ranked[:most]]
