"""A command driven through a pseudo-terminal, as a person at a keyboard would."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import time
from types import TracebackType


class Terminal:
    """`argv` run on a new pseudo-terminal with exactly `env`; read until a text shows,
    type, and wait for its exit code. Killed, if still running, on leaving."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(argv[0], argv, env)
        self.pid, self.fd = pid, fd
        self.seen = b""

    def read_until(self, text: bytes, timeout: float = 30) -> None:
        """Read until `text` has been shown (anywhere since the start); fail after
        `timeout` seconds, saying what was shown."""
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            assert time.monotonic() < deadline, f"no {text!r} in {self.seen!r}"
            ready, _, _ = select.select([self.fd], [], [], 0.5)
            if ready:
                with contextlib.suppress(OSError):
                    self.seen += os.read(self.fd, 4096)

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)

    def exit_code(self) -> int:
        """Wait for the command to end; its exit code."""
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)
