"""One task's process group: start it, watch it, stop it, adopt it after a restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from corral.agent.identity import SAFE_PATH


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/PID/stat line after the command name, from the state on
    (index 1 is the parent's pid, 19 the start time). The command name (field 2) is in
    parentheses and may itself contain spaces and parentheses."""
    return stat[stat.rindex(")") + 2 :].split()


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or
    None when there is no such process. With the pid it identifies a process for good:
    a pid reused later has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat_fields(stat)[19])


def started_at(proc_start: int) -> float:
    """Wall-clock time of a process start given in clock ticks since boot."""
    boot = 0.0
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            boot = float(line.split()[1])
            break
    return boot + proc_start / os.sysconf("SC_CLK_TCK")


def alive(pid: int, started: int) -> bool:
    """True when `pid` is still the process that started at `started` and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat_fields(stat)
    return fields[0] != "Z" and int(fields[19]) == started


@dataclass(slots=True)
class TaskProcess:
    """A running task: the launcher's pid (also the process group id) and where its exit
    code will be written."""

    pid: int
    proc_start: int
    exit_file: Path
    started_at: float
    popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def spawn(
        cls,
        command: list[str],
        env: dict[str, str],
        workdir: str | None,
        log_path: Path,
        exit_file: Path,
        user: str | None = None,
        launcher_options: tuple[str, ...] = (),
    ) -> TaskProcess:
        """Start `command` in a new process group, output appended to `log_path`, with
        exactly the environment `env`, as the Unix account `user` when given (and this
        process is root), in `workdir` when given."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        exit_file.parent.mkdir(parents=True, exist_ok=True)
        exit_file.unlink(missing_ok=True)
        options = ["--exit-file", str(exit_file)]
        if user is not None:
            options += ["--user", user]
        if workdir:
            options += ["--workdir", workdir]
        # Appended to across a task's runs; never through a symlink (O_NOFOLLOW).
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        with os.fdopen(os.open(log_path, flags, 0o600), "ab") as log:
            # -I and cwd "/": the launcher may keep root, so neither PYTHON* variables nor
            # a module in a directory a user can write may change what it imports.
            popen = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-m",
                    "corral.agent.launch",
                    *launcher_options,
                    *options,
                    "--",
                    *command,
                ],
                cwd="/",
                env={"PATH": SAFE_PATH},
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            assert popen.stdin is not None
            with popen.stdin:
                popen.stdin.write(json.dumps(env).encode())
        except OSError:
            # The launcher died before reading its environment.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            raise
        started = process_start(popen.pid) or 0
        return cls(popen.pid, started, exit_file, time.time(), popen)

    @classmethod
    def spawn_detached(
        cls,
        command: list[str],
        env: dict[str, str],
        workdir: str | None,
        log_path: Path,
        exit_file: Path,
        launcher_options: tuple[str, ...] = (),
        user: str | None = None,
    ) -> TaskProcess:
        """Like `spawn`, but the launcher leaves our process tree (`--detach`), so that
        whatever kills this process's children (a Ray worker whose raylet died) does not
        kill it; it is then watched like an adopted task. `launcher_options` are passed
        to the launcher (`--lease FILE --fence SECONDS`)."""
        pid_file = exit_file.with_suffix(".pid")
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.unlink(missing_ok=True)
        first = cls.spawn(
            command,
            env,
            workdir,
            log_path,
            exit_file,
            user,
            ("--detach", str(pid_file), *launcher_options),
        )
        assert first.popen is not None
        first.popen.wait()
        pid = int(pid_file.read_text())
        proc_start = process_start(pid)
        if proc_start is None:
            # Ended already; its exit file tells how.
            return cls(pid, 0, exit_file, time.time(), None)
        return cls(pid, proc_start, exit_file, time.time(), None)

    @classmethod
    def adopt(cls, pid: int, proc_start: int, exit_file: Path) -> TaskProcess:
        """A task started before a restart; it is not our child, so its end is read from
        its exit file."""
        return cls(pid, proc_start, exit_file, started_at(proc_start), None)

    def exit_code(self) -> int | None:
        """None while it runs; its exit code when it ended (128+N when killed by signal N,
        137 when the whole group was killed before the launcher could record anything)."""
        ended = self.ended()
        return None if ended is None else ended[0]

    def ended(self) -> tuple[int, str | None] | None:
        """None while it runs; else its exit code and the launcher's reason, if it gave one."""
        if self.popen is not None:
            launcher = self.popen.poll()
            if launcher is None:
                return None
        elif alive(self.pid, self.proc_start):
            return None
        try:
            lines = self.exit_file.read_text().splitlines()
            return int(lines[0]), (lines[1] if len(lines) > 1 and lines[1] else None)
        except (OSError, ValueError, IndexError):
            return 128 + signal.SIGKILL, None

    def signal(self, number: int) -> None:
        """Signal the whole process group; a group that is gone already is fine."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, number)
