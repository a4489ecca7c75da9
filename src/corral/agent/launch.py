"""The small parent of every task process:
`python -I -m corral.agent.launch --exit-file F [--user U] [--workdir D] -- CMD`.

It runs the command in its own process group (which the agent created), ignores the
SIGTERM that the agent sends to the whole group (the command gets it too and decides how
to stop; one sent before the command exists is passed on, or the command is not started),
and writes the command's exit code to F when it ends. The exit code then survives a
restart of the agent or the server: a task adopted after a restart is not the new
agent's child, so `wait()` could not tell how it ended, but the file can.

The launcher keeps the agent's identity (root, on a shared node) so that it can always
write F; only the command runs as account U (its uid, gid and groups), in D, with the
environment the agent writes to the launcher's standard input as a JSON object (without
one, it does not start the command). The launcher's own environment is the agent's
minimal one: nothing of the task's (such as LD_PRELOAD or PYTHONPATH) reaches a process
that keeps root.

Two options serve agents that run under Ray (`corral.cluster.ray`): `--detach PIDFILE`
makes the launcher leave its parent's process tree (a Ray worker kills its own children
when its raylet dies, while the task would live on), and `--lease FILE --fence SECONDS`
makes it kill its own process group when the agent has not renewed FILE for SECONDS, so
that a node cut off from the cluster never runs a task that was started again elsewhere.
The agent may write another number of seconds into FILE (the server's current fence
timeout): it counts from then on, for tasks that run already too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from corral.agent.identity import identity_of

NOT_FOUND = 127
CANNOT_RUN = 126
FENCED = 137
# How the reason of a fenced task begins (the agent reports its end as fenced).
FENCE_REASON = "fenced"
# The signals by which the agent (or a person at a terminal) asks a task to stop.
STOPS = (signal.SIGTERM, signal.SIGINT)
OPTIONS = {"--exit-file", "--user", "--workdir", "--detach", "--lease", "--fence"}
USAGE = (
    "usage: python -I -m corral.agent.launch --exit-file FILE [--user NAME] [--workdir DIR]"
    " [--detach PIDFILE] [--lease FILE --fence SECONDS]"
    " -- COMMAND [ARGS...]  (the command's environment as JSON on standard input)"
)


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


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]] | None:
    """The options before `--` and the command after it; None when they make no sense."""
    if "--" not in argv:
        return None
    split = argv.index("--")
    given, command = argv[:split], argv[split + 1 :]
    if len(given) % 2 or not command:
        return None
    options = dict(zip(given[::2], given[1::2], strict=True))
    if "--exit-file" not in options or set(options) - OPTIONS:
        return None
    if ("--lease" in options) != ("--fence" in options):
        return None
    try:
        float(options.get("--fence", "0"))
    except ValueError:
        return None
    return options, command


def _as_account(user: str | None, workdir: str | None) -> dict[str, Any]:
    """Popen's arguments that make the command run as `user` (uid, gid and the groups
    initgroups would give it) and in `workdir`. The directory is entered after the switch,
    in the child, so that a directory the account may not enter is refused."""
    settings: dict[str, Any] = {}
    if user is not None and os.geteuid() == 0:
        identity = identity_of(user)
        settings = {
            "user": identity.uid,
            "group": identity.gid,
            "extra_groups": list(identity.groups),
        }
    prepare: Callable[[], None] = _default_signals
    if workdir is not None:
        folder = workdir

        def prepare() -> None:
            _default_signals()
            try:
                os.chdir(folder)
            except OSError as error:
                # The parent only learns that preparing failed; the log tells why.
                os.write(2, f"corral: cannot enter {folder!r}: {error.strerror}\n".encode())
                raise

    settings["preexec_fn"] = prepare
    return settings


def _environment(given: str) -> dict[str, str]:
    """The command's environment, from the JSON object the agent wrote. Nothing written
    (the agent ended between starting the launcher and writing it) is refused: the command
    would otherwise run with this process's environment, which sets none of its devices."""
    if not given.strip():
        raise ValueError("no environment on standard input (its agent ended before sending it)")
    env = json.loads(given)
    if not isinstance(env, dict) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in env.items()
    ):
        raise ValueError("the environment on standard input is not a JSON object of strings")
    return env


def _fail(exit_file: str, code: int, reason: str) -> int:
    print(f"corral: {reason}", file=sys.stderr)
    write_exit(exit_file, code, reason)
    return code


def main(argv: list[str]) -> int:
    parsed = _options(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    options, command = parsed
    exit_file = options["--exit-file"]
    user, workdir = options.get("--user"), options.get("--workdir")
    lease = _lease(options)
    if "--detach" in options:
        _detach(options["--detach"])
    # A stop the agent sends the group before the command exists is the command's: it is
    # remembered until then, not ignored (the agent would not send it again).
    asked: list[int] = []
    for number in STOPS:
        signal.signal(number, lambda received, _frame: asked.append(received))
    try:
        env = _environment(sys.stdin.read())
        settings = _as_account(user, workdir)
    except (ValueError, LookupError) as error:
        return _fail(exit_file, CANNOT_RUN, f"cannot prepare the task: {error}")
    # While the command is started, a stop waits (blocked): sent after the fork, it
    # reaches the command too; sent before, only this process, which passes it on.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    if asked:
        code = 128 + asked[0]
        return _fail(exit_file, code, "stopped before its command started")
    try:
        # The child gets default signal handling back, so SIGTERM reaches user code.
        child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, **settings)
    except OSError as error:
        code = NOT_FOUND if isinstance(error, FileNotFoundError) else CANNOT_RUN
        return _fail(exit_file, code, f"cannot start {command[0]!r}: {error.strerror}")
    except ValueError as error:
        # A NUL byte or a bad variable name the agent let through.
        return _fail(exit_file, CANNOT_RUN, f"cannot start {command[0]!r}: {error}")
    except subprocess.SubprocessError:
        where = f"the working directory {workdir!r}"
        return _fail(exit_file, CANNOT_RUN, f"cannot enter {where} as {user or 'the agent user'}")
    waiting = signal.sigpending() & set(STOPS)
    # From now on the command gets the group's signals itself; this process ignores them
    # (which drops those waiting) and outlives the command to record how it ended.
    for number in STOPS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    for number in sorted(waiting):
        # At least once: one sent just after the fork reaches the command twice.
        child.send_signal(number)
    code = child.wait() if lease is None else _wait_fenced(child, exit_file, *lease)
    # A child killed by signal N reports -N; shells report 128 + N, and so do we.
    code = 128 - code if code < 0 else code
    write_exit(exit_file, code)
    return code


# -- under Ray: detaching and fencing ------------------------------------------------------


def _lease(options: dict[str, str]) -> tuple[str, float] | None:
    """The lease file and fence timeout of `--lease FILE --fence SECONDS`, if given."""
    fence = float(options.get("--fence", "0"))
    lease_file = options.get("--lease")
    return (lease_file, fence) if lease_file and fence > 0 else None


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
    lease has not been renewed for the fence timeout (`fence`, or the number in the lease
    file when the agent wrote one)."""
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        try:
            age = time.time() - os.stat(lease).st_mtime
        except OSError:
            age = float("inf")
        fence = _lease_timeout(lease, fence)
        if age > fence:
            reason = f"{FENCE_REASON}: its node was cut off from the cluster for {fence:g} s"
            print(f"corral: {reason}", file=sys.stderr, flush=True)
            write_exit(exit_file, FENCED, reason)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
