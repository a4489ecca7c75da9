"""The fair-share division, with numbers worked by hand."""

import math

import pytest

from corral.engine import Claim, divide


def test_deserved_first_then_leftover_by_weight() -> None:
    # 10 GPUs; a deserves 2 and wants 8, b deserves 2 and wants 8, weights 1:3.
    # Deserved: 2 + 2, leftover 6 split 1:3 -> a +1.5, b +4.5.
    shares = divide(10, [Claim(2, 8, weight=1), Claim(2, 8, weight=3)])
    assert shares == pytest.approx([3.5, 6.5])


def test_capped_queue_gives_its_rest_to_the_others() -> None:
    # 12 GPUs; a wants only 3 of an even split of 12 - 0 deserved.
    # First pass: 4 each, a capped at 3 -> 1 left, shared 1:1 by b and c -> 4.5 each.
    shares = divide(12, [Claim(0, 3), Claim(0, 10), Claim(0, 10)])
    assert shares == pytest.approx([3.0, 4.5, 4.5])


def test_limit_caps_like_demand() -> None:
    # a is limited to 2 although it wants 10; b takes the rest.
    shares = divide(8, [Claim(1, 10, limit=2), Claim(1, 10)])
    assert shares == pytest.approx([2.0, 6.0])


def test_higher_priority_is_served_first() -> None:
    # 8 GPUs, nothing deserved; the priority-200 queue wants 6 and gets all 6 before the
    # priority-100 queues divide the last 2 equally.
    shares = divide(8, [Claim(0, 6, priority=200), Claim(0, 6), Claim(0, 6)])
    assert shares == pytest.approx([6.0, 1.0, 1.0])


def test_weight_zero_gets_only_its_deserved() -> None:
    shares = divide(8, [Claim(1, 8, weight=0), Claim(1, 2, weight=1)])
    # b is capped at its demand of 2; the 5 GPUs left have no taker with a weight.
    assert shares == pytest.approx([1.0, 2.0])


def test_deserved_above_demand_is_not_given() -> None:
    shares = divide(4, [Claim(3, 1), Claim(1, 5)])
    assert shares == pytest.approx([1.0, 3.0])


def test_oversubscribed_deserved_quotas_are_honoured() -> None:
    # Deserved quotas may add up to more than the cluster: each still gets min(deserved,
    # demand), and nothing is left to lend.
    shares = divide(2, [Claim(2, 2), Claim(2, 3)])
    assert shares == pytest.approx([2.0, 2.0])


def test_unmanaged_resource_gives_each_its_demand() -> None:
    # CPU with no quota set: deserved is unlimited, so the share is the demand.
    shares = divide(64, [Claim(math.inf, 40), Claim(math.inf, 10)])
    assert shares == pytest.approx([40.0, 10.0])


def test_fractional_amounts() -> None:
    # 3 GPUs; 0.5 deserved each, demands 0.75 and 4; leftover 2 split evenly, a capped at
    # 0.25 more, b gets the rest: 0.5 + 1.75 + 0.75 = 3.
    shares = divide(3, [Claim(0.5, 0.75), Claim(0.5, 4)])
    assert shares == pytest.approx([0.75, 2.25])
