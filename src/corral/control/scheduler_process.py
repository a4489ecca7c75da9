"""The scheduler loop in a process of its own, beside the server's.

The API, the submission writer and the scheduler shared one interpreter, and under a
stream of submissions the scheduler's cycles took a fifth to a half of it (issue 18).
`SchedulerProcess` runs `SchedulerLoop` in a child process over its own connections to
the same database, and stands for it in the server: the same `trigger`, `shape`, `last`
and metrics. The two processes write the store under one write lock and count its
generation in the database (`corral.store.database`), so a cycle the child computed is
written only if nothing it depends on changed meanwhile, whichever process changed it.

They talk over a socket pair, in pickled messages (`multiprocessing.connection`): the
server sends wake-ups and asks for the last decisions; the child tells after every cycle
what it bound, evicted and released (the server's dispatcher starts and stops the
tasks), how long the cycle took, and the cluster's nodes and queues when they changed
(the admission check's shape). The socket is the child's only tie to the server: when it
closes (the server stopped or died, however), the child finishes its cycle and ends. A
child that ends while the server runs is started again.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from corral.control.metrics import SchedulerMetrics
from corral.engine.admission import Shape
from corral.model import Decisions, Eviction, Placement, SchedulerConfig
from corral.store.records import Release

log = logging.getLogger("corral.scheduler")
# The child may use this share of the time for cycles: it has an interpreter of its own,
# so its budget only keeps a stream of submissions from taking a whole core from the
# API and its clients on a small machine.
CHILD_CYCLE_SHARE = 1 / 3
# How long the server waits for the child's answer (the last decisions), and for it to
# end when stopped.
ANSWER_SECONDS = 10.0
STOP_SECONDS = 15.0
# The least time between two starts of a child that keeps ending.
RESTART_SECONDS = 1.0


# -- the messages ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setup:
    """The first message to the child: what its loop needs. The database URL goes here
    rather than on the command line, where any local user could read a password in it."""

    url: str
    config: SchedulerConfig
    interval: float


@dataclass(frozen=True, slots=True)
class Cycled:
    """From the child after each cycle: what the server needs of it."""

    at: float
    seconds: float
    cycles: int
    bindings: dict[str, tuple[Placement, ...]]
    evictions: tuple[Eviction, ...]
    releases: list[Release]
    # The nodes and queues the cycle saw, when they differ from the last ones sent.
    shape: Shape | None = None


@dataclass(frozen=True, slots=True)
class Ask:
    """From the server: the child's last decisions, please."""

    number: int


@dataclass(frozen=True, slots=True)
class Answer:
    number: int
    cycles: int
    last: Decisions | None


WAKE = "wake"
STOP = "stop"


# -- the server's side -------------------------------------------------------------------


@dataclass
class _Asked:
    done: threading.Event = field(default_factory=threading.Event)
    answer: Answer | None = None


class SchedulerProcess:
    """The scheduler loop run by a child process; for the server, what `SchedulerLoop`
    is (`trigger`, `shape`, `last`, `last_at`, `last_seconds`, `metrics`, `on_changes`)."""

    def __init__(
        self, url: str, config: SchedulerConfig | None = None, interval: float = 1.0
    ) -> None:
        self.setup = Setup(url, config or SchedulerConfig(), interval)
        # Called after a cycle that changed something, to tell the agents.
        self.on_changes: Callable[[Decisions, list[Release]], None] | None = None
        self.metrics = SchedulerMetrics()
        self.last_at: float | None = None
        self.last_seconds: float | None = None
        self.cycles = 0
        self._shape: Shape | None = None
        self._last: tuple[int, Decisions | None] | None = None
        self._connection: Connection | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._send_lock = threading.Lock()
        self._asked: dict[int, _Asked] = {}
        self._numbers = itertools.count(1)
        self._stopping = threading.Event()
        # Orders starting a child (again) against stopping.
        self._life_lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        """Start the child and the thread that reads what it says."""
        with self._life_lock:
            self._spawn()
        self._reader = threading.Thread(target=self._read, name="corral-scheduler", daemon=True)
        self._reader.start()

    def stop(self) -> None:
        """Ask the child to end after its cycle, and wait for it (kill it after a while)."""
        with self._life_lock:
            self._stopping.set()
        self._send(STOP)
        child = self._child
        if child is not None:
            try:
                child.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                log.error("the scheduler process did not stop; killing it")
                child.kill()
                child.wait()
        if self._connection is not None:
            self._connection.close()
        if self._reader is not None:
            self._reader.join(STOP_SECONDS)

    def trigger(self) -> None:
        """Ask for a cycle as soon as possible."""
        self._send(WAKE)

    def shape(self) -> Shape | None:
        """The nodes and queues the child's last cycle saw (None before the first)."""
        return self._shape

    @property
    def last(self) -> Decisions | None:
        """The decisions of the child's latest cycle; None before the first, or when the
        child does not answer in time. Asked for when needed (they name every pending
        workload's reason), and kept until another cycle has run."""
        kept = self._last
        if kept is not None and kept[0] == self.cycles:
            return kept[1]
        asked = _Asked()
        number = next(self._numbers)
        self._asked[number] = asked
        try:
            if not self._send(Ask(number)) or not asked.done.wait(ANSWER_SECONDS):
                return None
        finally:
            self._asked.pop(number, None)
        answer = asked.answer
        assert answer is not None
        self._last = (answer.cycles, answer.last)
        return answer.last

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            command = [sys.executable, "-m", __name__, str(theirs.fileno())]
            self._child = subprocess.Popen(command, pass_fds=(theirs.fileno(),))
            self._connection = Connection(os.dup(ours.fileno()))
        self._last = None
        self._send(self.setup)

    def _send(self, message: object) -> bool:
        """Send a message to the child; False when it cannot be reached (it ended)."""
        with self._send_lock:
            connection = self._connection
            if connection is None or connection.closed:
                return False
            try:
                connection.send(message)
            except (OSError, ValueError):
                return False
            return True

    def _read(self) -> None:
        """Take in what the child says; start another child when it ends too soon."""
        while True:
            connection = self._connection
            assert connection is not None
            try:
                message = connection.recv()
            except (EOFError, OSError):
                message = None
            if message is None:
                if self._stopping.is_set():
                    return
                self._restart()
                continue
            if isinstance(message, Cycled):
                self._cycled(message)
            elif isinstance(message, Answer):
                asked = self._asked.get(message.number)
                if asked is not None:
                    asked.answer = message
                    asked.done.set()

    def _restart(self) -> None:
        child = self._child
        code = None
        if child is not None:
            try:
                code = child.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                # Its socket is gone but not the process: it can be told nothing more.
                child.kill()
                code = child.wait()
        log.error("the scheduler process ended (exit code %s); starting another", code)
        with self._send_lock:
            if self._connection is not None:
                self._connection.close()
        time.sleep(RESTART_SECONDS)
        with self._life_lock:
            if not self._stopping.is_set():
                self._spawn()

    def _cycled(self, cycled: Cycled) -> None:
        if cycled.shape is not None:
            self._shape = cycled.shape
        decisions = Decisions(cycled.bindings, cycled.evictions, {}, {})
        self.metrics.cycle_done(cycled.seconds, decisions)
        self.last_at = cycled.at
        self.last_seconds = cycled.seconds
        self.cycles = cycled.cycles
        if self.on_changes is not None and decisions.changed:
            try:
                self.on_changes(decisions, cycled.releases)
            except Exception:
                log.exception("acting on a cycle's decisions failed")


# -- the child's side --------------------------------------------------------------------


def child(fd: int) -> None:
    """Run the scheduler loop for the server at the other end of socket `fd`."""
    # Imported here: the server imports this module for its side only.
    from corral.control.scheduler import SchedulerLoop
    from corral.store import Store

    # The server's signals (a Ctrl-C in its terminal) reach the child too: it ends when
    # the server closes the socket, after its cycle, not in the middle of one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    connection = Connection(fd)
    setup = connection.recv()
    assert isinstance(setup, Setup)
    store = Store(setup.url, migrate=False)
    send_lock = threading.Lock()

    def send(message: object) -> None:
        # The server went away: the main thread sees the socket closed, and ends.
        with send_lock, contextlib.suppress(OSError):
            connection.send(message)

    loop = SchedulerLoop(store, setup.config, setup.interval, share=CHILD_CYCLE_SHARE)
    told: list[Shape | None] = [None]

    def cycled(decisions: Decisions, releases: list[Release]) -> None:
        shape = loop.shape()
        if shape is not None and shape == told[0]:
            shape = None
        else:
            told[0] = shape
        at, seconds = loop.last_at, loop.last_seconds
        assert at is not None and seconds is not None
        bindings = dict(decisions.bindings)
        send(Cycled(at, seconds, loop.cycles, bindings, decisions.evictions, releases, shape))

    loop.on_cycle = cycled
    loop.start()
    loop.trigger()
    try:
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                break
            if message == WAKE:
                loop.trigger()
            elif isinstance(message, Ask):
                send(Answer(message.number, loop.cycles, loop.last))
            elif message == STOP:
                break
    finally:
        loop.stop()
        store.close()


if __name__ == "__main__":
    # Run as the module of its own name, not as __main__: the messages it unpickles are
    # of that module's classes.
    from corral.control.scheduler_process import child as run_child

    run_child(int(sys.argv[1]))
