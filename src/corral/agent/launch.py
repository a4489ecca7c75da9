"""The small parent of every task process:
`python -I -m corral.agent.launch --exit-file F [--user U] [--workdir D] -- CMD`.

It runs the command in its own process group (which the agent created), ignores the
SIGTERM that the agent sends to the whole group (the command gets it too and decides how
to stop), and writes the command's exit code to F when it ends. The exit code then
survives a restart of the agent or the server: a task adopted after a restart is not the
new agent's child, so `wait()` could not tell how it ended, but the file can.

The launcher keeps the agent's identity (root, on a shared node) so that it can always
write F; only the command runs as account U (its uid, gid and groups), in D, with the
environment the agent writes to the launcher's standard input as a JSON object. The
launcher's own environment is the agent's minimal one: nothing of the task's (such as
LD_PRELOAD or PYTHONPATH) reaches a process that keeps root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from corral.agent.identity import identity_of

NOT_FOUND = 127
CANNOT_RUN = 126
USAGE = (
    "usage: python -I -m corral.agent.launch --exit-file FILE [--user NAME] [--workdir DIR]"
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


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]] | None:
    """The options before `--` and the command after it; None when they make no sense."""
    if "--" not in argv:
        return None
    split = argv.index("--")
    given, command = argv[:split], argv[split + 1 :]
    if len(given) % 2 or not command:
        return None
    options = dict(zip(given[::2], given[1::2], strict=True))
    if "--exit-file" not in options or set(options) - {"--exit-file", "--user", "--workdir"}:
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
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        given = "" if sys.stdin.isatty() else sys.stdin.read()
        # No environment given (a launcher started by hand): the command inherits ours.
        env = json.loads(given) if given.strip() else None
        settings = _as_account(user, workdir)
    except (ValueError, LookupError) as error:
        return _fail(exit_file, CANNOT_RUN, f"cannot prepare the task: {error}")
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
    code = child.wait()
    # A child killed by signal N reports -N; shells report 128 + N, and so do we.
    code = 128 - code if code < 0 else code
    write_exit(exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
