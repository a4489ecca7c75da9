"""The small parent of every task process: `python -m corral.agent.launch --exit-file F -- CMD`.

It runs the command in its own process group (which the agent created), ignores the
SIGTERM that the agent sends to the whole group (the command gets it too and decides how
to stop), and writes the command's exit code to F when it ends. The exit code then
survives a restart of the agent or the server: a task adopted after a restart is not the
new agent's child, so `wait()` could not tell how it ended, but the file can.

Two options serve agents that run under Ray (`corral.cluster.ray`): `--detach PIDFILE`
makes the launcher leave its parent's process tree (a Ray worker kills its own children
when its raylet dies, while the task would live on), and `--lease FILE --fence SECONDS`
makes it kill its own process group when the agent has not renewed FILE for SECONDS, so
that a node cut off from the control plane never runs a task that was started again
elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

NOT_FOUND = 127
FENCED = 137


def write_exit(path: str, code: int, reason: str = "") -> None:
    """The exit code on the first line; why, when the launcher knows better than the code."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        handle.write(f"{code}\n{reason}\n" if reason else f"{code}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _default_signals() -> None:
    # Ignored signals stay ignored across exec; the command must see SIGTERM and SIGINT.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Blocked signals stay blocked too, and Ray's workers block SIGINT.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def main(argv: list[str]) -> int:
    argv, detach, lease = _ray_options(argv)
    if len(argv) < 4 or argv[0] != "--exit-file" or argv[2] != "--":
        print(
            "usage: python -m corral.agent.launch [--detach PIDFILE] [--lease FILE --fence S]"
            " --exit-file FILE -- COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 2
    exit_file, command = argv[1], argv[3:]
    if detach is not None:
        _detach(detach)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # The child gets default signal handling back, so SIGTERM reaches user code.
        child = subprocess.Popen(command, preexec_fn=_default_signals)
    except OSError as error:
        reason = f"cannot start {command[0]!r}: {error.strerror}"
        print(f"corral: {reason}", file=sys.stderr)
        write_exit(exit_file, NOT_FOUND, reason)
        return NOT_FOUND
    code = child.wait() if lease is None else _wait_fenced(child, exit_file, *lease)
    # A child killed by signal N reports -N; shells report 128 + N, and so do we.
    code = 128 - code if code < 0 else code
    write_exit(exit_file, code)
    return code


# -- under Ray: detaching and fencing ------------------------------------------------------


def _ray_options(argv: list[str]) -> tuple[list[str], str | None, tuple[str, float] | None]:
    """Take the leading `--detach PIDFILE` and `--lease FILE --fence SECONDS` off argv."""
    detach: str | None = None
    lease_file: str | None = None
    fence = 0.0
    while len(argv) >= 2 and argv[0] in ("--detach", "--lease", "--fence"):
        option, value, argv = argv[0], argv[1], argv[2:]
        if option == "--detach":
            detach = value
        elif option == "--lease":
            lease_file = value
        else:
            fence = float(value)
    return argv, detach, ((lease_file, fence) if lease_file and fence > 0 else None)


def _detach(pid_file: str) -> None:
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


def _wait_fenced(child: subprocess.Popen[bytes], exit_file: str, lease: str, fence: float) -> int:
    """Wait for the child; kill the whole process group, this launcher included, when the
    lease has not been renewed for `fence` seconds."""
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        try:
            age = time.time() - os.stat(lease).st_mtime
        except OSError:
            age = float("inf")
        if age > fence:
            reason = f"fenced: its agent lost the control plane for {fence:g} s"
            print(f"corral: {reason}", file=sys.stderr, flush=True)
            write_exit(exit_file, FENCED, reason)
            os.killpg(os.getpgid(0), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
