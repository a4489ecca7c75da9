"""How the scheduler loop paces its cycles: while wake-ups stream in, each cycle is
followed by a rest in proportion to how long it took, so that cycles bind what arrived
meanwhile in one go; a wake-up after a quiet cycle is served at once. On a real store,
with the loop's own thread."""

from __future__ import annotations

import threading
import time

import pytest

from corral.control import scheduler as scheduler_module
from corral.control.scheduler import STREAM_REST, SchedulerLoop
from corral.store import Store


def timed_cycles(loop: SchedulerLoop) -> list[tuple[float, float]]:
    """Appends (when the cycle's report came, how long the cycle took) for every cycle."""
    seen: list[tuple[float, float]] = []

    def report(_decisions: object, _releases: object) -> None:
        assert loop.last_seconds is not None
        seen.append((time.perf_counter(), loop.last_seconds))

    loop.on_cycle = report
    return seen


def test_while_wake_ups_stream_in_each_cycle_rests_in_proportion(store: Store) -> None:
    # A share of all the time: the CPU budget never makes a cycle wait, only the rest.
    loop = SchedulerLoop(store, interval=5.0, share=1.0)
    seen = timed_cycles(loop)
    loop.start()
    stop = threading.Event()

    def stream() -> None:
        while not stop.is_set():
            loop.trigger()
            time.sleep(0.0005)

    streaming = threading.Thread(target=stream)
    try:
        streaming.start()
        # Ten cycles, however long a loaded machine takes for them.
        deadline = time.perf_counter() + 60
        while len(seen) < 10 and time.perf_counter() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        streaming.join()
        loop.stop()
    # Every cycle was woken while it ran; the next one began no sooner than the rest.
    starts = [reported - seconds for reported, seconds in seen]
    assert len(seen) >= 10
    for (reported, seconds), start in zip(seen[:-1], starts[1:], strict=True):
        assert start - reported >= STREAM_REST * seconds - 5e-4


def test_a_wake_up_after_a_quiet_cycle_is_served_at_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rest as long as the interval (2 s) after any cycle woken while it ran: a
    # wake-up that came after the cycle must not wait for it.
    monkeypatch.setattr(scheduler_module, "STREAM_REST", 10_000.0)
    loop = SchedulerLoop(store, interval=2.0, share=1.0)
    seen = timed_cycles(loop)
    loop.start()
    try:
        for _ in range(3):
            count = len(seen)
            time.sleep(0.05)  # after the last cycle, quiet
            woken = time.perf_counter()
            loop.trigger()
            deadline = woken + 10
            while len(seen) == count and time.perf_counter() < deadline:
                time.sleep(0.001)
            assert len(seen) > count
            reported, seconds = seen[count]
            assert reported - seconds - woken < 0.5
    finally:
        loop.stop()
