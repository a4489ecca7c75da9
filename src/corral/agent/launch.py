"""The small parent of every task process: `python -m corral.agent.launch --exit-file F -- CMD`.

It runs the command in its own process group (which the agent created), ignores the
SIGTERM that the agent sends to the whole group (the command gets it too and decides how
to stop), and writes the command's exit code to F when it ends. The exit code then
survives a restart of the agent or the server: a task adopted after a restart is not the
new agent's child, so `wait()` could not tell how it ended, but the file can.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

NOT_FOUND = 127


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


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--exit-file" or argv[2] != "--":
        print(
            "usage: python -m corral.agent.launch --exit-file FILE -- COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 2
    exit_file, command = argv[1], argv[3:]
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
    code = child.wait()
    # A child killed by signal N reports -N; shells report 128 + N, and so do we.
    code = 128 - code if code < 0 else code
    write_exit(exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
