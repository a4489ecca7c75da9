"""The queue-tree rules of corral.model.queues, shared by the store, the scenario loader
and the engine."""

from __future__ import annotations

import math

import pytest

from corral.model import (
    LimitBelowDeserved,
    NegativeAmount,
    Queue,
    QueueCycle,
    Resources,
    UnknownParent,
    check_quota,
    check_tree,
)


def test_a_cycle_is_named_from_the_member_listed_first() -> None:
    queues = [Queue("root"), Queue("b", parent="c"), Queue("c", parent="a"), Queue("a", "b")]
    with pytest.raises(QueueCycle) as found:
        check_tree(queues)
    assert found.value.cycle == ("b", "c", "a")
    assert found.value.message == "cycle b -> c -> a -> b"


def test_an_unknown_parent_is_found_before_any_cycle() -> None:
    with pytest.raises(UnknownParent) as found:
        check_tree([Queue("a", parent="a"), Queue("b", parent="x")])
    assert (found.value.queue, found.value.parent) == ("b", "x")


def test_a_limit_may_not_be_below_deserved_beyond_one_tolerance() -> None:
    check_quota(Queue("q", deserved=Resources(2.0, math.inf, math.inf), limit=Resources(2.0)))
    check_quota(Queue("q", deserved=Resources(2.0), limit=Resources(2.0 - 1e-12)))
    with pytest.raises(LimitBelowDeserved) as below:
        check_quota(Queue("q", deserved=Resources(2.0, 1.0, 0.0), limit=Resources(1.0)))
    assert (below.value.field, below.value.message) == ("limit.gpu", "1 is below deserved 2")
    with pytest.raises(NegativeAmount) as negative:
        check_quota(Queue("q", over_quota_weight=Resources(1.0, -1.0, 1.0)))
    assert negative.value.field == "over_quota_weight.cpu"
