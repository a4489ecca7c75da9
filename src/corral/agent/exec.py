"""Commands run beside a task (`corral exec`, `corral shell`): in the task's environment
(its variables, devices, working directory and Unix account) and inside its walls (its
cgroup and namespaces: corral.agent.enter), as children of the agent, with a
pseudo-terminal for a shell. They are stopped when their workload's task stops, and what
they leave dies with the task. A command becomes the task's account before it touches
any path: the working directory is entered as that account, never as the agent's root."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.agent.enter import TaskWalls
from corral.agent.identity import Identity

# A window size a terminal cannot have; larger values are clamped.
MAX_WINDOW = 1000
# How often a command whose output has ended is looked at until it exits: soon at first
# (most exit with their output), then at most every EXIT_POLL_MAX seconds.
EXIT_POLL_FIRST = 0.005
EXIT_POLL_MAX = 0.5
# A stream's fd once this session has closed it.
CLOSED = -1
# The walls of a task that has none (limits are off): the agent's own.
OUTSIDE = TaskWalls()


@dataclass
class ExecSession:
    """One command's process group with its standard streams as non-blocking fds: `output`
    (stdout, or the terminal), `errors` (stderr; None with a terminal) and `input`."""

    workload: str
    process: subprocess.Popen[bytes]
    input: int
    output: int
    errors: int | None
    tty: bool
    closed: bool = field(default=False)

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's window size (no terminal: nothing to do)."""
        if not self.tty:
            return
        rows, cols = max(1, min(rows, MAX_WINDOW)), max(1, min(cols, MAX_WINDOW))
        with contextlib.suppress(OSError):
            fcntl.ioctl(self.output, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def end_input(self) -> None:
        """No more input: close stdin (with a terminal, send end-of-file, ^D)."""
        if self.tty:
            with contextlib.suppress(OSError):
                os.write(self.input, b"\x04")
            return
        # Closed once: the number may belong to another session's stream (or a client's
        # socket) by the time the session is released.
        fd, self.input = self.input, CLOSED
        if fd != CLOSED:
            with contextlib.suppress(OSError):
                os.close(fd)

    def control(self, text: str) -> None:
        """A client's control message, `{"resize": [ROWS, COLS]}` or `{"eof": true}`;
        what cannot be read is ignored."""
        try:
            message = json.loads(text)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        size = message.get("resize")
        if isinstance(size, list) and len(size) == 2 and all(type(n) is int for n in size):
            self.resize(size[0], size[1])
        if message.get("eof") is True:
            self.end_input()

    async def exited(self, gone: asyncio.Future[Any]) -> int | None:
        """Its exit code once the command ends (128 + N when killed by signal N), or None
        when `gone` (the client's side of the session) ends first. Polled from the event
        loop, not waited for in a thread: a command may close its output and run on for
        as long as it likes, and a member could keep any number of threads waiting."""
        pause = EXIT_POLL_FIRST
        while (code := self.process.poll()) is None:
            if gone.done():
                return None
            await asyncio.sleep(pause)
            pause = min(2 * pause, EXIT_POLL_MAX)
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        """Stop the whole process group at once: the session is over."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def release(self) -> None:
        """Kill the group, reap it and close our ends of its streams."""
        if self.closed:
            return
        self.closed = True
        self.kill()
        with contextlib.suppress(Exception):
            self.process.wait(timeout=5)
        for fd in {self.input, self.output, self.errors}:
            if fd is not None and fd != CLOSED:
                with contextlib.suppress(OSError):
                    os.close(fd)


# What a failed child reports on its pipe, before its errno: what it could not do.
WALLS, WORKDIR = b"walls", b"workdir"


@contextlib.contextmanager
def _entering(
    walls: TaskWalls, identity: Identity | None, workdir: str, tty: bool
) -> Iterator[Callable[[], None]]:
    """Popen's `preexec_fn`, run in the child before the command: as root, it enters the
    task's walls (`TaskWalls.join`); then it becomes the account (its groups, gid and
    uid), takes the terminal when `tty`, and only then enters `workdir`. Entered as root,
    the directory could be a symlink its account swapped in, to a directory of another
    account's that it may not reach by path; from inside, it could read what is below.
    Walls that cannot be entered, or a directory the account may not enter, are raised
    as OSError saying which; the child's errno comes back through a pipe."""
    readable, writable = os.pipe()
    os.set_blocking(readable, False)

    def failed(what: bytes, error: OSError) -> None:
        os.write(writable, what + b" " + str(error.errno).encode())

    def prepare() -> None:
        try:
            walls.join()
        except OSError as error:
            failed(WALLS, error)
            raise
        if identity is not None:
            os.setgroups(list(identity.groups))
            os.setresgid(identity.gid, identity.gid, identity.gid)
            os.setresuid(identity.uid, identity.uid, identity.uid)
        if tty:
            # After setsid: the pty on fd 0 becomes the controlling terminal, so that ^C
            # and job control reach the shell's foreground job.
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        try:
            os.chdir(workdir)
        except OSError as error:
            failed(WORKDIR, error)
            raise

    try:
        yield prepare
    except subprocess.SubprocessError:
        what, code = _child_errno(readable, writable)
        writable = CLOSED
        if code is None:
            raise
        who = identity.name if identity is not None else "the agent's user"
        if what == WALLS:
            why = f"cannot enter its task's cgroup and namespaces: {os.strerror(code)}"
        else:
            why = f"cannot enter the working directory {workdir!r} as {who}: {os.strerror(code)}"
        raise OSError(code, why) from None
    finally:
        for fd in (readable, writable):
            if fd != CLOSED:
                os.close(fd)


def _child_errno(readable: int, writable: int) -> tuple[bytes, int | None]:
    """What a failed child could not do and its errno, if it wrote them; closes `writable`
    first (the child, having failed, has exited: nothing else holds the pipe open for
    long)."""
    os.close(writable)
    try:
        what, _, number = os.read(readable, 64).partition(b" ")
    except BlockingIOError:
        return b"", None
    return what, int(number) if number.isdigit() else None


def spawn(
    workload: str,
    command: Sequence[str],
    env: Mapping[str, str],
    workdir: str,
    identity: Identity | None,
    tty: bool,
    walls: TaskWalls = OUTSIDE,
) -> ExecSession:
    """Start `command` in a session of its own, inside its task's `walls` (see
    corral.agent.enter), as `identity` when given (a root agent), in `workdir` (entered
    as that account: see `_entering`), with exactly `env`; with a pseudo-terminal when
    `tty`. OSError or ValueError when it cannot start."""
    primary = secondary = CLOSED
    if tty:
        primary, secondary = pty.openpty()
    streams = [secondary] * 3 if tty else [subprocess.PIPE] * 3
    try:
        with _entering(walls, identity, workdir, tty) as prepare:
            process = walls.forking(
                lambda: subprocess.Popen(
                    list(command),
                    stdin=streams[0],
                    stdout=streams[1],
                    stderr=streams[2],
                    preexec_fn=prepare,
                    start_new_session=True,
                    env=dict(env),
                )
            )
    except BaseException:
        if tty:
            os.close(primary)
        raise
    finally:
        if tty:
            os.close(secondary)
    if tty:
        os.set_blocking(primary, False)
        return ExecSession(workload, process, primary, primary, None, True)
    assert process.stdin and process.stdout and process.stderr
    # The fds are handed to the session, which closes them; the file objects must not.
    fds = [os.dup(stream.fileno()) for stream in (process.stdin, process.stdout, process.stderr)]
    for stream in (process.stdin, process.stdout, process.stderr):
        stream.close()
    for fd in fds:
        os.set_blocking(fd, False)
    return ExecSession(workload, process, fds[0], fds[1], fds[2], False)


class Sessions:
    """The agent's live exec sessions by workload, to stop them with their task."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_workload: dict[str, set[int]] = {}
        self._sessions: dict[int, ExecSession] = {}

    def add(self, session: ExecSession) -> None:
        with self._lock:
            self._sessions[id(session)] = session
            self._by_workload.setdefault(session.workload, set()).add(id(session))

    def forget(self, session: ExecSession) -> None:
        """The session is over (its bridge ended); it is no longer tracked."""
        with self._lock:
            self._sessions.pop(id(session), None)
            self._by_workload.get(session.workload, set()).discard(id(session))

    def stop_workload(self, workload: str) -> None:
        """Kill every session of `workload`: its task stopped. Their bridges see the end
        of their output and close."""
        with self._lock:
            doomed = [self._sessions[key] for key in self._by_workload.pop(workload, set())]
        for session in doomed:
            session.kill()

    def stop_all(self) -> None:
        with self._lock:
            doomed = list(self._sessions.values())
            self._by_workload.clear()
        for session in doomed:
            session.kill()
