"""The small parent of every task process:
`python -I -m corral.agent.launch --exit-file F [--user U] [--workdir D] [--cgroup DIRS]
[--namespace pid] [--log-cap BYTES] -- CMD`.

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

The walls between tasks (docs/security.md): before anything else it enters the task's
cgroup (`--cgroup`, its directories joined by ":"), so that the command and all it
starts are in it from their first instruction; with `--namespace pid` the command runs
in a process namespace of its own, below an init that is this launcher's child
(corral.agent.namespaces); with `--log-cap` the command writes into a pipe that the
launcher copies into the log, keeping at most that many bytes (corral.agent.logcap).
Under Ray it also detaches and fences itself (corral.agent.supervise).

A task in a container (`--container PODMAN`, corral.agent.containers): the command is
`PODMAN ... run ...`, and it keeps the launcher's root, since podman must be rootful to
run the container's processes as the task's account (its `--user`, with no capability and
no-new-privileges). So that nothing of the task's reaches a process that keeps root, the
environment on standard input is the container's, not podman's: the launcher writes it
into an anonymous file in memory, podman's standard input, which podman reads as its env
file (`--env-file /dev/stdin`); podman itself runs with an environment of its own that
holds only a PATH of system directories, in "/". The launcher refuses any command but a
run of that podman, and `--user` and `--workdir` with it (the account and directory are
podman's arguments).
`--namespace pid` is not applied: the container has a process namespace of its own, and
podman must record the pids the agent's own `podman rm` will act on, the machine's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from corral.agent.identity import identity_of
from corral.agent.logcap import CappedLog
from corral.agent.supervise import FENCE_REASON, FENCED, detach, lease_of, supervise

NOT_FOUND = 127
CANNOT_RUN = 126
__all__ = ["CANNOT_RUN", "FENCED", "FENCE_REASON", "NOT_FOUND", "main", "write_exit"]
# The signals by which the agent (or a person at a terminal) asks a task to stop.
STOPS = (signal.SIGTERM, signal.SIGINT)
OPTIONS = {
    "--exit-file",
    "--user",
    "--workdir",
    "--detach",
    "--lease",
    "--fence",
    "--cgroup",
    "--namespace",
    "--log-cap",
    "--container",
}
USAGE = (
    "usage: python -I -m corral.agent.launch --exit-file FILE [--user NAME] [--workdir DIR]"
    " [--cgroup DIR[:DIR...]] [--namespace pid] [--log-cap BYTES]"
    " [--detach PIDFILE] [--lease FILE --fence SECONDS] [--container PODMAN]"
    " -- COMMAND [ARGS...]  (the command's environment as JSON on standard input)"
)


class Refused(Exception):
    """The command does not start; its exit code and why are in the exit file already."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


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
    if options.get("--namespace", "pid") != "pid":
        return None
    if "--container" in options and not _runs_podman(options, command):
        return None
    try:
        float(options.get("--fence", "0"))
        int(options.get("--log-cap", "0"))
    except ValueError:
        return None
    return options, command


def _runs_podman(options: dict[str, str], command: list[str]) -> bool:
    """Whether `command` may keep root as a container task's: a run of the absolute path
    `--container` names, and nothing of an account's to switch to or enter."""
    podman = options["--container"]
    if "--user" in options or "--workdir" in options or not os.path.isabs(podman):
        return False
    return command[0] == podman and "run" in command[1:]


def _in_container(env: dict[str, str], settings: dict[str, Any]) -> dict[str, str]:
    """podman's environment and standard input for a container task: a PATH of system
    directories only, and the container's environment `env` as an env file in memory
    (ValueError when a value cannot be written in one)."""
    from corral.agent.containers import PODMAN_PATH, env_file

    given = os.memfd_create("corral-env", os.MFD_CLOEXEC)
    with open(given, "wb", closefd=False) as handle:
        handle.write(env_file(env))
    os.lseek(given, 0, os.SEEK_SET)
    settings["stdin"] = given
    return {"PATH": PODMAN_PATH}


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
    settings["stdin"] = subprocess.DEVNULL
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


def _fail(exit_file: str, code: int, reason: str) -> Refused:
    print(f"corral: {reason}", file=sys.stderr, flush=True)
    write_exit(exit_file, code, reason)
    return Refused(code)


def _enter_cgroup(exit_file: str, directories: str | None) -> None:
    """Move this process into the task's cgroup, in every hierarchy: what it starts from
    now on is born there."""
    for directory in directories.split(":") if directories else []:
        try:
            if not os.path.isabs(directory):
                raise OSError(0, "not an absolute path")
            with open(os.path.join(directory, "cgroup.procs"), "w") as handle:
                handle.write(f"{os.getpid()}\n")
        except OSError as error:
            reason = f"cannot enter its cgroup {directory}: {error.strerror}"
            raise _fail(exit_file, CANNOT_RUN, reason) from None


def _start(
    command: list[str],
    env: dict[str, str],
    settings: dict[str, Any],
    exit_file: str,
    who: str,
    workdir: str | None,
) -> subprocess.Popen[bytes]:
    """Start the command (stops are blocked meanwhile: see `_pass_on_stops`)."""
    try:
        # The child gets default signal handling back, so SIGTERM reaches user code.
        return subprocess.Popen(command, env=env, **settings)
    except OSError as error:
        code = NOT_FOUND if isinstance(error, FileNotFoundError) else CANNOT_RUN
        raise _fail(exit_file, code, f"cannot start {command[0]!r}: {error.strerror}") from None
    except ValueError as error:
        # A NUL byte or a bad variable name the agent let through.
        raise _fail(exit_file, CANNOT_RUN, f"cannot start {command[0]!r}: {error}") from None
    except subprocess.SubprocessError:
        where = f"the working directory {workdir!r}"
        raise _fail(exit_file, CANNOT_RUN, f"cannot enter {where} as {who}") from None


def _pass_on_stops(child: int) -> None:
    """From now on `child` gets the group's signals itself; this process ignores them
    (which drops those waiting, blocked while the child was started) and passes on those
    that came meanwhile: at least once, since one sent just after the fork reaches the
    child twice."""
    waiting = signal.sigpending() & set(STOPS)
    for number in STOPS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    for number in sorted(waiting):
        os.kill(child, number)


def _init(start: Callable[[], subprocess.Popen[bytes]], exit_file: str) -> int:
    """Process 1 of the task's process namespace: a /proc of its own, the command, and
    every orphan of the namespace reaped until the command ends (with it ends the
    namespace, and whatever still runs in it)."""
    from corral.agent.namespaces import private_proc

    try:
        private_proc()
    except OSError as error:
        raise _fail(exit_file, CANNOT_RUN, f"cannot mount its own /proc: {error}") from None
    command = start()
    _pass_on_stops(command.pid)
    while True:
        found, status = os.waitpid(-1, 0)
        if found == command.pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def _in_namespace(
    start: Callable[[], subprocess.Popen[bytes]], exit_file: str, source: int | None
) -> int:
    """Start the task's init (`_init`) in a new process namespace; its pid, here. The init
    has no use for `source`, the launcher's end of the output pipe."""
    from corral.agent.namespaces import CLONE_NEWPID, unshare

    try:
        unshare(CLONE_NEWPID)
    except OSError as error:
        raise _fail(exit_file, CANNOT_RUN, f"cannot make its process namespace: {error}") from None
    pid = os.fork()
    if pid == 0:
        code = CANNOT_RUN
        if source is not None:
            os.close(source)
        try:
            code = _init(start, exit_file)
        except Refused as refused:
            code = refused.code
        finally:
            os._exit(code)
    return pid


def main(argv: list[str]) -> int:
    parsed = _options(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    options, command = parsed
    exit_file = options["--exit-file"]
    try:
        return _run(options, command, exit_file)
    except Refused as refused:
        return refused.code


def _run(options: dict[str, str], command: list[str], exit_file: str) -> int:
    user, workdir = options.get("--user"), options.get("--workdir")
    _enter_cgroup(exit_file, options.get("--cgroup"))
    lease = lease_of(options)
    if "--detach" in options:
        detach(options["--detach"])
    # A stop the agent sends the group before the command exists is the command's: it is
    # remembered until then, not ignored (the agent would not send it again).
    asked: list[int] = []
    for number in STOPS:
        signal.signal(number, lambda received, _frame: asked.append(received))
    try:
        env = _environment(sys.stdin.read())
        settings = _as_account(user, workdir)
        if "--container" in options:
            env = _in_container(env, settings)
    except (ValueError, LookupError) as error:
        raise _fail(exit_file, CANNOT_RUN, f"cannot prepare the task: {error}") from None
    output = _pipe(settings, int(options.get("--log-cap", "0")))
    # While the command is started, a stop waits (blocked): sent after the fork, it
    # reaches the command too; sent before, only this process, which passes it on.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    if asked:
        raise _fail(exit_file, 128 + asked[0], "stopped before its command started")
    who = user or "the agent user"

    def start() -> subprocess.Popen[bytes]:
        return _start(command, env, settings, exit_file, who, workdir)

    # Kept until the end: a Popen collected earlier reaps its child as it goes.
    process: subprocess.Popen[bytes] | None = None
    if options.get("--namespace") == "pid" and "--container" not in options:
        child = _in_namespace(start, exit_file, output[0] if output else None)
    else:
        process = start()
        child = process.pid
    if output is not None:
        os.close(settings["stdout"])
    _pass_on_stops(child)
    _spared_by_oom_killer()
    code = supervise(child, output, lease, lambda why: write_exit(exit_file, FENCED, why))
    # A child killed by signal N reports -N; shells report 128 + N, and so do we.
    code = 128 - code if code < 0 else code
    if not os.path.exists(exit_file):
        # The task's init wrote it already when the command could not start.
        write_exit(exit_file, code)
    return code


def _spared_by_oom_killer() -> None:
    """Over its memory limit, the kernel kills a process of the task, never its launcher
    (which counts against the limit too), so that the end is recorded. Set after the
    command started: it would inherit it."""
    if os.geteuid() == 0:
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("-1000\n")


def _pipe(settings: dict[str, Any], cap: int) -> tuple[int, CappedLog] | None:
    """With a cap, the command writes into a pipe this launcher copies into the log (its
    own standard output); the read end and the log, for `supervise`."""
    if cap <= 0:
        return None
    source, sink = os.pipe()
    settings["stdout"] = settings["stderr"] = sink
    return source, CappedLog(sys.stdout.fileno(), cap)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
