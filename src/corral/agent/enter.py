"""An exec session's way into its task's walls (docs/security.md).

`corral exec` and `corral shell` run their command beside a running task, and inside
its walls: in the task's cgroup, so that it counts against the task's memory, CPU and
pids limits, opens only the task's GPUs and is killed with what the task leaves behind
before the task's devices are free; and in the process and mount namespaces of the
task's init, so that it sees, through the task's own /proc, the task's processes only,
and dies with the task's command.

The agent, which has threads, forks the command. Its process namespace is entered
first, with setns, on a thread of its own that forks the command and then ends: a
process namespace so entered is that of the thread's children to come, never its own,
so the command is born inside, and no other thread of the agent ever forks there. The
child, still root, writes itself into the task's cgroup and enters the init's mount
namespace; only then does it become the task's account and touch any path of the
account's (corral.agent.exec).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from corral.agent import namespaces
from corral.agent.cgroups import TaskCgroup
from corral.agent.namespaces import CLONE_NEWNS, CLONE_NEWPID, setns
from corral.agent.process import alive, stat_fields
from corral.agent.strays import launcher_option

# How long a session waits for a task that is starting to have its init run its command
# (its /proc is mounted by then), and how often it looks meanwhile.
START_WAIT = 10.0
POLL = 0.02

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TaskWalls:
    """What a session enters: the directories of the task's cgroup, and open fds of its
    init's process and mount namespaces (None: the task has none, and the session runs
    in the agent's)."""

    cgroups: tuple[str, ...] = ()
    pid: int | None = None
    mount: int | None = None

    def forking(self, start: Callable[[], T]) -> T:
        """`start()`, which forks the command, with the command born in the task's
        process namespace: on a thread of its own that ends after."""
        if self.pid is None:
            return start()
        namespace = self.pid

        def inside() -> T:
            setns(namespace, CLONE_NEWPID)
            return start()

        with ThreadPoolExecutor(1, thread_name_prefix="corral-exec-fork") as thread:
            return thread.submit(inside).result()

    def join(self) -> None:
        """In the forked child, as root, before anything else: into the task's cgroup in
        every hierarchy, then into its init's mount namespace (its /proc). OSError when
        the kernel refuses (the task has just ended)."""
        for directory in self.cgroups:
            fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, f"{os.getpid()}\n".encode())
            finally:
                os.close(fd)
        if self.mount is not None:
            setns(self.mount, CLONE_NEWNS)


@contextlib.contextmanager
def entered(
    launcher: int, proc_start: int, cgroup: TaskCgroup | None, wait: float = START_WAIT
) -> Iterator[TaskWalls]:
    """The walls of the task whose launcher is `launcher` (started at `proc_start`), for
    the duration of the block: its cgroup (None: limits are off) and, when its launcher
    was told to make one, its process namespace. LookupError when the launcher has ended,
    or its init has not started its command within `wait` seconds (or has ended)."""
    namespaces.loaded()
    directories = tuple(str(path) for path in cgroup.paths()) if cgroup is not None else ()
    fds = _namespaces(launcher, proc_start, wait)
    try:
        yield TaskWalls(directories, *fds)
    finally:
        for fd in fds:
            os.close(fd)


def _namespaces(launcher: int, proc_start: int, wait: float) -> tuple[int, int] | tuple[()]:
    """Fds of the process and mount namespaces of the launcher's init, once it runs the
    task's command; none when the launcher makes no namespace."""
    try:
        arguments = _read(f"/proc/{launcher}/cmdline").split(b"\0")
        outside = os.stat(f"/proc/{launcher}/ns/pid")
    except OSError:
        raise LookupError("its process has ended") from None
    if not alive(launcher, proc_start):
        raise LookupError("its process has ended")
    if launcher_option(arguments, b"--namespace") != "pid":
        return ()
    deadline = time.monotonic() + wait
    while (found := _init_namespaces(launcher, (outside.st_dev, outside.st_ino))) is None:
        if not alive(launcher, proc_start):
            raise LookupError("its process has ended")
        if time.monotonic() > deadline:
            raise LookupError(f"its command has not started within {wait:g} s")
        time.sleep(POLL)
    return found


def _init_namespaces(launcher: int, outside: tuple[int, int]) -> tuple[int, int] | None:
    """The launcher's child in a process namespace other than the launcher's (`outside`,
    its device and inode): its init, once that has a child of its own (the command,
    started once the init's /proc is mounted); fds of its process and mount namespaces."""
    parents = _parents()
    busy = set(parents.values())
    for pid, parent in parents.items():
        if parent != launcher or pid not in busy:
            continue
        with contextlib.suppress(OSError):
            folder = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
            try:
                # Read through the folder: the process found, or nothing if it has gone
                # (its pid, taken again meanwhile, would be another folder).
                inside = os.stat("ns/pid", dir_fd=folder)
                if _parent(_read("stat", folder)) != launcher:
                    continue
                if (inside.st_dev, inside.st_ino) == outside:
                    continue
                pid_fd = os.open("ns/pid", os.O_RDONLY, dir_fd=folder)
                try:
                    return pid_fd, os.open("ns/mnt", os.O_RDONLY, dir_fd=folder)
                except OSError:
                    os.close(pid_fd)
                    raise
            finally:
                os.close(folder)
    return None


def _parents() -> dict[int, int]:
    """Every process's parent, by pid."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                found[int(entry)] = _parent(_read(f"/proc/{entry}/stat"))
    return found


def _parent(stat: bytes) -> int:
    return int(stat_fields(os.fsdecode(stat))[1])


def _read(path: str, folder: int | None = None) -> bytes:
    """A small /proc file's bytes, relative to `folder` (an fd) when given."""
    fd = os.open(path, os.O_RDONLY, dir_fd=folder)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)
