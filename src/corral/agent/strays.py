"""Task processes that an agent finds running when it starts but was not told about.

A task's launcher (`python -I -m corral.agent.launch --exit-file DATA/run/D/task-N.exit`,
D the workload's directory name, NAME.ID: corral.model.spec.directory_name)
outlives its agent on purpose: a restarted agent adopts the tasks the store binds, by
the pid and start time the store recorded. Two kinds of process escape that: a task
evicted by a preemption the store committed just before a crash (it was never sent its
SIGTERM) and a task spawned just before a crash whose start was never recorded. Nobody
would ever stop either. The agent finds them in /proc, by their launcher's exit file in
its own data directory, and holds them as strays: the reconciler stops those the store
does not bind, the agent stops those whose task is started again under another launch,
and a stray's devices count as held until it has gone: its launcher, and every process
of its cgroup (`--cgroup` in the launcher's arguments), which is killed once the
launcher has ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from corral.agent.cgroups import Hierarchy, TaskCgroup, cleared
from corral.agent.process import alive, process_start
from corral.model.spec import workload_of_directory

log = logging.getLogger("corral.agent")

LAUNCHER = b"corral.agent.launch"
EXIT_FILE = re.compile(r"^task-(\d{1,9})\.exit$")
# A process's environment is read only this far: it names the stray's devices.
ENVIRON_LIMIT = 1 << 20


@dataclass(slots=True)
class Stray:
    """A launcher nobody adopted: its task, its pid (also its process group), start time,
    the devices its command holds (None when unknown: then it may hold any), and the name
    of its workload's directories (which tells a deleted workload's task from that of a
    later workload of the same name)."""

    workload: str
    task: int
    pid: int
    proc_start: int
    shares: list[tuple[int, float]] | None = None
    kill_at: float | None = None
    reason: str | None = None
    directory: str = ""
    cgroup: TaskCgroup | None = None

    @property
    def key(self) -> tuple[str, int]:
        return self.workload, self.task

    def alive(self) -> bool:
        """Whether anything of it runs: its launcher, or what is left in its cgroup (which
        is killed then)."""
        return alive(self.pid, self.proc_start) or not cleared(self.cgroup)

    def signal(self, number: int) -> None:
        """Signal its whole process group (a group that has gone already is fine), and
        for SIGKILL its whole cgroup."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, number)
        if number == signal.SIGKILL and self.cgroup is not None:
            self.cgroup.kill()


def _arguments(pid: int) -> list[bytes] | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None


def launcher_option(arguments: list[bytes], name: bytes) -> str | None:
    """A launcher's option: among its own options, before "--"; the task's command after
    it may say anything (a task could name another's exit file in its arguments)."""
    options = arguments[: arguments.index(b"--")] if b"--" in arguments else arguments
    if name not in options:
        return None
    at = options.index(name) + 1
    return os.fsdecode(options[at]) if at < len(options) else None


def _task_of(arguments: list[bytes], run_dir: Path) -> tuple[str, int] | None:
    """The (directory name, task) of a launcher whose exit file lies in `run_dir`, else
    None."""
    if LAUNCHER not in arguments:
        return None
    exit_file = launcher_option(arguments, b"--exit-file")
    if exit_file is None:
        return None
    path = Path(exit_file)
    matched = EXIT_FILE.match(path.name)
    if matched is None or path.parent.parent.resolve() != run_dir:
        return None
    return path.parent.name, int(matched.group(1))


def _shares(pid: int) -> list[tuple[int, float]] | None:
    """The devices a task's command holds, from its environment (CUDA_VISIBLE_DEVICES and
    CORRAL_GPU_FRACTION, which the agent set); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read(ENVIRON_LIMIT)
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    try:
        devices = [int(d) for d in env.get(b"CUDA_VISIBLE_DEVICES", b"").split(b",") if d]
        fraction = float(env.get(b"CORRAL_GPU_FRACTION", b"1"))
    except ValueError:
        return None
    if not devices:
        return []
    share = fraction / len(devices) if fraction < 1 else 1.0
    return [(device, share) for device in devices]


def _launcher_like(pid: int) -> bool:
    """A launcher leads its own process group and runs as the agent's account (a task that
    runs as its submitter cannot pass for one by naming a launcher in its arguments)."""
    try:
        return os.getpgid(pid) == pid and os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def find_strays(run_dir: Path, hierarchy: Hierarchy | None = None) -> dict[int, Stray]:
    """The launchers alive now whose exit file is `run_dir/DIRECTORY/task-N.exit`, by pid
    (a task may have two: one of an earlier launch), with the devices their commands hold
    (a hostile command may rewrite its environment; it gains nothing but a quicker start
    for whoever is given its devices, since it is stopped anyway) and their cgroups in
    `hierarchy`."""
    run_dir = run_dir.resolve()
    launchers: dict[int, tuple[str, int]] = {}
    cgroups: dict[int, TaskCgroup | None] = {}
    others: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == os.getpid():
            continue
        arguments = _arguments(pid)
        if arguments is None:
            continue
        key = _task_of(arguments, run_dir)
        if key is None:
            others.append(pid)
        elif _launcher_like(pid):
            launchers[pid] = key
            given = launcher_option(arguments, b"--cgroup")
            if hierarchy is not None and given:
                cgroups[pid] = hierarchy.owned(given.split(":"))
    strays: dict[int, Stray] = {}
    for pid, (directory, task) in launchers.items():
        started = process_start(pid)
        if started is not None and alive(pid, started):
            workload = workload_of_directory(directory)
            cgroup = cgroups.get(pid)
            strays[pid] = Stray(workload, task, pid, started, directory=directory, cgroup=cgroup)
    for pid in others:
        try:
            group = os.getpgid(pid)
        except OSError:
            continue
        stray = strays.get(group)
        if stray is not None and stray.shares is None:
            stray.shares = _shares(pid)
    for stray in strays.values():
        log.warning(
            "found task %s/%s (launcher pid %d) running from before this agent started",
            stray.workload,
            stray.task,
            stray.pid,
        )
    return strays


def stop(stray: Stray, now: float, grace: float, reason: str) -> None:
    """SIGTERM now, SIGKILL after `grace` (a stray asked twice keeps its first deadline)."""
    if stray.kill_at is None:
        stray.kill_at = now + grace
        stray.reason = reason
        log.warning(
            "stopping task %s/%s (launcher pid %d) found running: %s",
            stray.workload,
            stray.task,
            stray.pid,
            reason,
        )
        stray.signal(signal.SIGTERM)
