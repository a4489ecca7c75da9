"""The server's worker threads: how many run blocking work at once, and which work waits
apart.

Handlers that are plain functions, and the store calls the asynchronous ones make, run in
AnyIO's worker threads. Each holds the interpreter for most of its time: it reads or
writes the store and builds its answer. AnyIO lets 40 run at once; under many concurrent
requests they then spend much of the server's time handing the interpreter to one
another. So the server lets `CORRAL_WORKER_THREADS` (4 by default) run at once, and the
rest wait their turn in the event loop, which costs little. Four still overlap
PostgreSQL's round trips (docs/control-plane.md has the figures).

Calls that may wait on a member's processes or on a node (opening an exec session, which
on a Ray cluster asks the node's agent; releasing one, which waits up to 5 s for its
processes to go) run in threads of their own, at most `WAITING_THREADS` at once, and never
hold a worker thread. (The end of a session's command is not waited for in a thread at
all: `ExecSession.exited`.)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from anyio import CapacityLimiter, to_thread
from anyio.lowlevel import RunVar

T = TypeVar("T")

WORKER_THREADS = 4
WAITING_THREADS = 64
# One limiter per event loop, as AnyIO keeps its default one.
_waiting: RunVar[CapacityLimiter] = RunVar("corral_waiting_threads")


def worker_threads() -> int:
    """How many worker threads CORRAL_WORKER_THREADS asks for; ValueError naming it when
    it is not a whole number of at least 1."""
    value = os.environ.get("CORRAL_WORKER_THREADS", "").strip()
    if not value:
        return WORKER_THREADS
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(
            f"CORRAL_WORKER_THREADS must be a whole number of at least 1, not {value!r}"
        )
    return threads


def limit_worker_threads(threads: int) -> None:
    """Let `threads` worker threads run at once in the running event loop."""
    to_thread.current_default_thread_limiter().total_tokens = threads


async def run_waiting(func: Callable[..., T], *args: object) -> T:
    """`func(*args)` in a thread apart from the worker threads, for a call that may wait
    long on a process or a node."""
    try:
        limiter = _waiting.get()
    except LookupError:
        limiter = CapacityLimiter(WAITING_THREADS)
        _waiting.set(limiter)
    return await to_thread.run_sync(func, *args, limiter=limiter)
