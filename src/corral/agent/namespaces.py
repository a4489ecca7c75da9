"""A process namespace per task, so that a task sees only its own processes.

The launcher (root) calls `unshare(CLONE_NEWPID)`; its next child is then process 1 of a
new namespace: the task's init (`corral.agent.launch`), which mounts a /proc of that
namespace in a mount namespace of its own, starts the command, reaps whatever is
orphaned to it, and ends with the command's exit code. When it ends, the kernel kills
everything left in the namespace. The launcher itself stays in the agent's namespace,
with the pid the store records.

An exec session enters a task's namespaces with `setns` (corral.agent.enter).

Python 3.11 has neither os.unshare, os.setns nor a mount call, so they come from the C
library.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 0x40000


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def loaded() -> None:
    """Look up the C library's functions now. A child forked from a process with threads
    (an exec session, between fork and exec) must not: the lock of the dynamic loader may
    be held by a thread that the fork left behind."""
    libc = _libc()
    for name in ("setns", "unshare", "mount"):
        getattr(libc, name)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def unshare(flags: int) -> None:
    """unshare(2); OSError when the kernel refuses."""
    _check(_libc().unshare(flags), "unshare")


def setns(fd: int, kind: int) -> None:
    """setns(2): enter the namespace of `kind` that `fd` (a /proc/PID/ns file) names; for
    CLONE_NEWPID, the namespace of the calling thread's children to come. OSError when
    the kernel refuses."""
    _check(_libc().setns(fd, kind), "setns")


def private_proc() -> None:
    """In a new mount namespace (of the calling process, process 1 of its pid namespace),
    a /proc that shows only that pid namespace: mounts made private first, so that the
    new /proc never reaches the agent's own mount namespace."""
    libc = _libc()
    unshare(CLONE_NEWNS)
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(libc.mount(b"proc", b"/proc", b"proc", flags, None), "mounting /proc")


def available() -> str | None:
    """None when this kernel gives a task a process namespace of its own (tried in a
    child process, as the launcher would); else why not."""
    if os.geteuid() != 0:
        return "corral does not run as root"
    try:
        probe = subprocess.run(
            [sys.executable, "-I", "-m", "corral.agent.namespaces"],
            capture_output=True,
            timeout=30,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot try: {error}"
    if probe.returncode == 0:
        return None
    return probe.stderr.decode(errors="replace").strip() or f"exit {probe.returncode}"


def _probe() -> int:
    """Make a pid namespace and, in its process 1, a private /proc: what a task needs."""
    try:
        unshare(CLONE_NEWPID)
    except OSError as error:
        print(error.strerror, file=sys.stderr)
        return 1
    child = os.fork()
    if child == 0:
        try:
            private_proc()
        except OSError as error:
            print(error.strerror, file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0 if os.getpid() == 1 else 1)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(_probe())
