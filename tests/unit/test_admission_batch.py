"""A batch's admission check reads the store once, however many workloads it holds, and
names the first that can never run by its place (corral.control.admission)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import event

from corral.control.admission import Admission
from corral.model import Node, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Invalid, Store


def spec(name: str, gpu: float) -> WorkloadSpec:
    return WorkloadSpec(name, "team", "alice", (TaskGroup("worker", 1, gpu),))


def test_a_batch_is_checked_against_one_read_of_the_store(store: Store) -> None:
    devices = tuple(Device(i, f"v-{i}", "virtual", 80 << 30, True) for i in range(4))
    store.register_node(NodeSpec(Node("n1", gpus=4), devices, virtual=True))
    store.create_queue(Queue("team", deserved=Resources(4.0, math.inf, math.inf)))
    # No scheduler, so no kept shape: every check that is not answered from memory
    # asks the store.
    admission = Admission(store)
    statements: list[str] = []

    def counted(*args: Any) -> None:
        statements.append(args[2])

    event.listen(store.engine, "before_cursor_execute", counted)
    try:
        admission.check_all([spec(f"w{i}", 1) for i in range(300)])
        # The generation once, the nodes and queues once: not once per workload.
        assert 1 <= len(statements) <= 6, statements
        statements.clear()
        batch = [spec(f"w{i}", 1) for i in range(300)]
        batch[150] = spec("big", 16)
        with pytest.raises(Invalid) as refused:
            admission.check_all(batch)
        assert refused.value.at == ("workloads", 150, "tasks", 0)
        assert refused.value.field == "gpu"
        assert "the largest has 4" in str(refused.value)
        assert len(statements) <= 6, statements
    finally:
        event.remove(store.engine, "before_cursor_execute", counted)
