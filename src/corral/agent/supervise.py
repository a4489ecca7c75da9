"""The launcher's watch over its command (corral.agent.launch): until the command ends,
it copies the command's output into the task's capped log and, under Ray, watches the
lease that the agent renews.

Two options serve agents that run under Ray (`corral.cluster.ray`): `--detach PIDFILE`
makes the launcher leave its parent's process tree (a Ray worker kills its own children
when its raylet dies, while the task would live on), and `--lease FILE --fence SECONDS`
makes it kill its own process group when the agent has not renewed FILE for SECONDS, so
that a node cut off from the cluster never runs a task that was started again elsewhere.
The agent may write another number of seconds into FILE (the server's current fence
timeout): it counts from then on, for tasks that run already too.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Callable

from corral.agent.logcap import CappedLog

FENCED = 137
# How the reason of a fenced task begins (the agent reports its end as fenced).
FENCE_REASON = "fenced"
# How often the lease is looked at, and how long the output left in the pipe when the
# command ends (a process it left behind may write on) is copied at most.
LEASE_EVERY = 0.5
DRAIN_LIMIT = 16 << 20
CHUNK = 1 << 16


def supervise(
    pid: int,
    output: tuple[int, CappedLog] | None,
    lease: tuple[str, float] | None,
    fenced: Callable[[str], None],
) -> int:
    """Wait for the child `pid` and return its exit code (-N when killed by signal N),
    copying `output` (the read end of the command's pipe, and the log) as it comes, and
    calling `fenced(reason)` when the lease is not renewed in time."""
    try:
        ended = os.pidfd_open(pid)
    except OSError:
        ended = -1  # a kernel before 5.3: the child is looked at every 50 ms instead
    watched = [fd for fd in (ended, output[0] if output else -1) if fd >= 0]
    timeout = 0.05 if ended < 0 else LEASE_EVERY if lease is not None else None
    try:
        while True:
            found, status = os.waitpid(pid, os.WNOHANG)
            if found:
                if output is not None:
                    _drain(*output)
                return os.waitstatus_to_exitcode(status)
            if lease is not None:
                _check_lease(*lease, fenced)
            ready, _, _ = select.select(watched, [], [], timeout)
            if output is not None and output[0] in ready and not _copy(*output):
                watched.remove(output[0])  # every writer closed it
    finally:
        if ended >= 0:
            os.close(ended)


def _copy(source: int, log: CappedLog) -> bool:
    """Copy what the pipe holds now; False at its end."""
    try:
        data = os.read(source, CHUNK)
    except BlockingIOError:
        return True
    if data:
        log.write(data)
    return bool(data)


def _drain(source: int, log: CappedLog) -> None:
    """What the command wrote last, without waiting for writers it left behind."""
    os.set_blocking(source, False)
    copied = 0
    with contextlib.suppress(OSError):
        while copied < DRAIN_LIMIT and (data := os.read(source, CHUNK)):
            log.write(data)
            copied += len(data)


# -- under Ray: detaching and fencing ------------------------------------------------------


def lease_of(options: dict[str, str]) -> tuple[str, float] | None:
    """The lease file and fence timeout of `--lease FILE --fence SECONDS`, if given."""
    fence = float(options.get("--fence", "0"))
    lease_file = options.get("--lease")
    return (lease_file, fence) if lease_file and fence > 0 else None


def detach(pid_file: str) -> None:
    """Fork; the child goes on in a session of its own and the parent, once the child's
    pid is in `pid_file`, exits. The launcher is then nobody's child but init's."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(ready_write)
        os.read(ready_read, 1)  # the child's process group exists: it can be signalled
        temporary = f"{pid_file}.tmp"
        with open(temporary, "w") as handle:
            handle.write(f"{pid}\n")
        os.replace(temporary, pid_file)
        os._exit(0)
    os.close(ready_read)
    os.setsid()
    os.write(ready_write, b"1")
    os.close(ready_write)


def _check_lease(lease: str, fence: float, fenced: Callable[[str], None]) -> None:
    """Kill the whole process group, this launcher included, when the lease has not been
    renewed for the fence timeout (`fence`, or the number in the lease file when the
    agent wrote one)."""
    try:
        age = time.time() - os.stat(lease).st_mtime
    except OSError:
        age = float("inf")
    fence = _lease_timeout(lease, fence)
    if age > fence:
        reason = f"{FENCE_REASON}: its node was cut off from the cluster for {fence:g} s"
        print(f"corral: {reason}", file=sys.stderr, flush=True)
        fenced(reason)
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _lease_timeout(lease: str, fence: float) -> float:
    """The fence timeout the agent wrote into the lease file; `fence` when it wrote none
    (or nothing sensible)."""
    try:
        with open(lease) as handle:
            written = float(handle.read(32).strip() or "nan")
    except (OSError, ValueError):
        return fence
    return written if 0 < written < 86_400 else fence
