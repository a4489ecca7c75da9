"""`corral why` in the engine's rules (engine.explain): plain values, no server."""

from __future__ import annotations

import math

from corral.engine.explain import Holder, Why, deepen
from corral.model import Decisions, Queue, QueueStatus, Resources, TaskGroup
from corral.model.spec import WorkloadSpec

NONE = Resources(0.0, 0.0, 0.0)


def status(allocated: float, fair_share: float) -> QueueStatus:
    return QueueStatus(
        NONE, NONE, Resources(fair_share, 0.0, 0.0), Resources(allocated, 0.0, 0.0), NONE
    )


def why_of(gpu: float) -> Why:
    queues = [Queue("a", deserved=Resources(2, math.inf, math.inf)), Queue("b")]
    spec = WorkloadSpec("w", "a", "u", (TaskGroup(gpu=gpu, cpu=1.0),))
    holder = Holder("x", "b", 0, True, "n1", 4.0)
    plain = Why("w", "pending", "waits", 1, (), (holder,))
    last = Decisions({}, (), {}, {"a": status(3.0, 2.0), "b": status(4.0, 1.0)})
    return deepen(plain, spec, queues, last)


def test_a_queue_over_its_fair_share_may_not_reclaim_gpus() -> None:
    why = why_of(1.0)
    assert why.reclaim == (
        "not allowed: a holds 3 of its fair share of 2 GPUs, and 1 more would exceed it"
    )
    assert (
        why.holders[0].may_take == "no: a holds 3 of its fair share of 2 GPUs, and 1 more "
        "would exceed it"
    )


def test_work_that_asks_for_no_gpu_may_always_reclaim_as_the_engine_says() -> None:
    # `Reclaim.could_take`: work that asks for no GPU always may. `corral why` used to say
    # that its queue, over its fair share, would exceed it with 0 more.
    why = why_of(0.0)
    assert why.holders[0].may_take == "reclaim"
    assert why.reclaim == "4 GPUs may be taken back from b (over their fair share)"
