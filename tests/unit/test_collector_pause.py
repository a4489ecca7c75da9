"""The engine pauses Python's cycle collector while a cycle runs, and only then."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from corral.engine.cycle import collector_paused


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_during_a_cycle_and_on_again_after_it() -> None:
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # a pool's cycle inside a cycle
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_failing_cycle_turns_it_on_again() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the cycle failed")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_program_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_cycles_in_two_threads_share_one_pause() -> None:
    # The first cycle ends while the second still runs: the collector stays off until
    # the last one ends.
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with collector_paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with collector_paused():
            second_in.set()
            first_out.wait(5)
            seen.append(gc.isenabled())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [False]
    assert gc.isenabled()
