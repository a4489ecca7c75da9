"""The CLI tests' commands, forked from a process that has imported the CLI once.

A `corral` command spends most of its CPU importing (Typer and the Pydantic it builds
parameters with, httpx, Rich, the CLI's modules): about a second of CPU each, and the CLI
tests run some 400 commands, a fifth of a CI run's CPU. `Forks` is a process that imports
`corral.cli.main` once and then forks one child per command: the child sets the command's
environment, working directory and standard streams, and calls the application as the
console script does (`sys.exit(app())`), in a process of its own. What the command does,
prints and exits with is the console script's; only the interpreter's start and the
imports are shared. The console script itself is still run as a program by the tests that
start it directly (test_readme, test_yaml_bounds, test_cli_output's, the agent tests).

CORRAL_TEST_CLI_FORKS=0 runs every command as a program of its own instead.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

ENABLED = os.environ.get("CORRAL_TEST_CLI_FORKS", "1") != "0"


class Forks:
    """The forking process: `run` takes a command's arguments, environment and input and
    returns what `subprocess.run(..., capture_output=True, text=True)` would."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            # Not the test process's standard streams: pytest-xdist's workers talk to
            # the main process over them.
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
            self.connection = Connection(os.dup(ours.fileno()))
        self.lock = threading.Lock()

    def run(
        self, args: list[str], env: dict[str, str], stdin: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        with self.lock, tempfile.TemporaryDirectory(prefix="corral-cli-") as directory:
            streams = Path(directory)
            source = streams / "stdin"
            source.write_text(stdin or "")
            out, err = streams / "stdout", streams / "stderr"
            request = (args, env, os.getcwd(), str(source), str(out), str(err))
            self.connection.send(request)
            pid: int = self.connection.recv()
            if not self.connection.poll(timeout):
                os.kill(pid, signal.SIGKILL)
                self.connection.recv()
                raise subprocess.TimeoutExpired(["corral", *args], timeout)
            code: int = self.connection.recv()
            return subprocess.CompletedProcess(
                ["corral", *args], code, out.read_text(), err.read_text()
            )

    def close(self) -> None:
        self.connection.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_forks: Forks | None = None


def forks() -> Forks:
    """This process's forking process, started on first use."""
    global _forks
    if _forks is None:
        _forks = Forks()
        atexit.register(_forks.close)
    return _forks


def _serve(connection: Connection) -> None:
    """Fork a child per request until the test process goes away."""
    from corral.cli.main import app

    while True:
        try:
            args, env, cwd, stdin, stdout, stderr = connection.recv()
        except (EOFError, OSError):
            return
        pid = os.fork()
        if pid == 0:
            connection.close()
            os._exit(_command(app, args, env, cwd, (stdin, stdout, stderr)))
        connection.send(pid)
        _, status = os.waitpid(pid, 0)
        connection.send(os.waitstatus_to_exitcode(status))


def _command(
    app: object, args: list[str], env: dict[str, str], cwd: str, streams: tuple[str, str, str]
) -> int:
    """In the forked child: run the command as the console script would; its exit code."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        for fd, path in enumerate(streams):
            flags = os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = ["corral", *args]
        try:
            sys.exit(app())  # type: ignore[operator]
        except SystemExit as exit:
            # As the interpreter ends on SystemExit.
            if exit.code is None:
                code = 0
            elif isinstance(exit.code, int):
                code = exit.code
            else:
                print(exit.code, file=sys.stderr)
                code = 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
