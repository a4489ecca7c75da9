"""A cgroup per task: its memory, CPU and pids limits, the GPUs it may open, and every
process it started, wherever that process moved in the process tree.

A task's cgroup is `corral/AGENT/DIRECTORY.task-N.launch-L` (AGENT: a digest of the
agent's data directory, so that two agents of one machine never share one; DIRECTORY:
the workload's NAME.ID), under the root of each v1 hierarchy (`memory`, `cpu`, `pids`,
and `devices` and `freezer` where mounted) or of the v2 tree. The name is all a
restarted agent needs to find the cgroup of a task it adopts. The launcher enters it
before it starts the command (`corral.agent.launch --cgroup`), so nothing the task runs
is ever outside; the agent kills what is left in it when the task ends or is stopped,
and removes it once it is empty.

cgroup v2 is taken where its tree has the memory, cpu and pids controllers; v1 where
each of them is mounted. Devices are walled on v1 only (its `devices` controller): v2
needs an eBPF program of type BPF_PROG_TYPE_CGROUP_DEVICE for that, which corral does
not load (see docs/security.md).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

# Every controller a task's limits need, and those used where they are there.
REQUIRED = ("memory", "cpu", "pids")
OPTIONAL_V1 = ("devices", "freezer")
PARENT = "corral"
# The CFS period the CPU quota is a share of (the kernel's default), in microseconds.
CPU_PERIOD = 100_000
# NVIDIA's character devices: /dev/nvidiaN is 195:N (N < 254; 254 and 255 are the
# modeset and control devices every CUDA process opens).
NVIDIA_MAJOR = 195
# How long a kill waits for a v1 freezer to say FROZEN before it kills regardless.
FREEZE_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What a task may use: memory in bytes, CPU in cores (0: no quota), at most `pids`
    processes and threads, and none of the NVIDIA device minors in `denied`."""

    memory: int
    cpu: float
    pids: int
    denied: tuple[int, ...] = ()


def agent_key(data_dir: Path) -> str:
    """The name of an agent's own cgroup: stable across its restarts, distinct per data
    directory."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def task_name(directory: str, task: int, launch: int | None, attempt: int) -> str:
    """A launch's cgroup name: the workload's directory, its task and which binding of
    the task it is (the attempt for a server that numbers no launches). Two dotted parts
    more than any interface file has, so it never names one."""
    return f"{directory}.task-{task}.launch-{launch if launch is not None else f'a{attempt}'}"


@dataclass(frozen=True, slots=True)
class TaskCgroup:
    """One task's cgroup: its directory in each hierarchy, by controller (v2: one
    directory for all)."""

    version: int
    name: str
    dirs: Mapping[str, Path]

    def paths(self) -> list[Path]:
        """Its distinct directories (a v1 controller may share a mount with another)."""
        return list(dict.fromkeys(self.dirs.values()))

    def create(self, limits: Limits) -> None:
        """Make it (again, if a crash left an empty one) with `limits`. OSError when the
        kernel refuses."""
        for path in self.paths():
            path.mkdir(exist_ok=True)
        if self.version == 2:
            self._limit_v2(limits)
        else:
            self._limit_v1(limits)

    def _limit_v1(self, limits: Limits) -> None:
        memory = self.dirs["memory"]
        _write(memory / "memory.limit_in_bytes", limits.memory)
        # With swap accounting, the same bound on memory and swap: no escape into swap.
        if (memory / "memory.memsw.limit_in_bytes").exists():
            _write(memory / "memory.memsw.limit_in_bytes", limits.memory)
        cpu = self.dirs["cpu"]
        _write(cpu / "cpu.cfs_period_us", CPU_PERIOD)
        _write(cpu / "cpu.cfs_quota_us", _quota(limits.cpu) or -1)
        _write(self.dirs["pids"] / "pids.max", limits.pids)
        devices = self.dirs.get("devices")
        if devices is not None:
            for minor in limits.denied:
                _write(devices / "devices.deny", f"c {NVIDIA_MAJOR}:{minor} rwm")

    def _limit_v2(self, limits: Limits) -> None:
        path = self.dirs["memory"]
        _write(path / "memory.max", limits.memory)
        if (path / "memory.swap.max").exists():
            _write(path / "memory.swap.max", 0)
        quota = _quota(limits.cpu)
        _write(path / "cpu.max", f"{quota or 'max'} {CPU_PERIOD}")
        _write(path / "pids.max", limits.pids)

    def processes(self) -> set[int]:
        """The processes in it now, and in the cgroups below it (none when it is gone):
        podman makes a container task's cgroup below the task's (corral.agent.containers)."""
        found: set[int] = set()
        for path in _below(self.dirs["pids"]):
            try:
                text = (path / "cgroup.procs").read_text()
            except OSError:
                continue
            found.update(int(line) for line in text.split() if line.isdigit())
        return found

    def signal(self, number: int) -> None:
        """Signal every process in it."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, number)

    def kill(self) -> None:
        """SIGKILL everything in it, without a fork escaping between the reading of its
        processes and the kill: v2's cgroup.kill, else frozen first (v1's freezer, v2's
        cgroup.freeze), else again and again (its pids limit bounds a fork race)."""
        first = self.dirs["pids"]
        if self.version == 2 and (first / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(first / "cgroup.kill", 1)
            return
        with self._frozen():
            for _ in range(3):
                self.signal(signal.SIGKILL)

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[None]:
        if self.version == 2:
            state, frozen, thawed = self.dirs["pids"] / "cgroup.freeze", "1", "0"
        else:
            freezer = self.dirs.get("freezer")
            state = freezer / "freezer.state" if freezer else Path("/nonexistent")
            frozen, thawed = "FROZEN", "THAWED"
        try:
            _write(state, frozen)
        except OSError:
            yield  # no freezer: kill as it runs
            return
        if self.version == 1:
            _wait_for(state, frozen)
        try:
            yield
        finally:
            # Killed processes die once thawed.
            with contextlib.suppress(OSError):
                _write(state, thawed)

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for going over its memory limit."""
        path = self.dirs["memory"]
        found = _field(path / ("memory.events" if self.version == 2 else "memory.oom_control"))
        return found.get("oom_kill", 0)

    def memory_limit(self) -> int | None:
        """Its memory limit in bytes, as the kernel has it (None: unknown or none)."""
        path = self.dirs["memory"]
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        try:
            value = (path / name).read_text().strip()
        except OSError:
            return None
        return int(value) if value.isdigit() else None

    def remove(self) -> bool:
        """Remove it, and the (empty) cgroups below it; False while a process is still in
        any of them."""
        gone = True
        for path in [below for top in self.paths() for below in reversed(_below(top))]:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as error:
                if error.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise
                gone = False
        return gone


def cleared(cgroup: TaskCgroup | None) -> bool:
    """Whether nothing a task started is left, once its launcher has ended: what is left
    (a process that left the task's process group, `setsid`) is killed, and the cgroup
    removed once empty. Until then the task holds its devices."""
    if cgroup is None:
        return True
    if cgroup.processes():
        cgroup.kill()
        return False
    return cgroup.remove()


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where one agent's task cgroups live: its directory in each hierarchy, by
    controller (v2: the same directory for all)."""

    version: int
    parents: Mapping[str, Path]

    @classmethod
    def v2(cls, root: Path, key: str) -> Hierarchy:
        return cls(2, {name: root / PARENT / key for name in REQUIRED})

    @classmethod
    def v1(cls, mounts: Mapping[str, Path], key: str) -> Hierarchy:
        wanted = REQUIRED + OPTIONAL_V1
        return cls(1, {name: mounts[name] / PARENT / key for name in wanted if name in mounts})

    def describe(self) -> str:
        controllers = ", ".join(self.parents)
        return f"cgroup v{self.version} ({controllers})"

    def prepare(self) -> None:
        """Make the agent's directories; on v2, let the controllers reach the tasks' cgroups
        below them (each level from the tree's root down hands them on). OSError when the
        kernel refuses (not root, a read-only mount, a v2 level with processes of its
        own)."""
        for path in dict.fromkeys(self.parents.values()):
            path.mkdir(parents=True, exist_ok=True)
        if self.version == 2:
            agent = self.parents["memory"]
            for level in (agent.parent.parent, agent.parent, agent):
                enabled = set((level / "cgroup.subtree_control").read_text().split())
                wanted = [f"+{name}" for name in REQUIRED if name not in enabled]
                if wanted:
                    _write(level / "cgroup.subtree_control", " ".join(wanted))

    def task(self, name: str) -> TaskCgroup:
        return TaskCgroup(
            self.version, name, {key: path / name for key, path in self.parents.items()}
        )

    def tasks(self) -> list[TaskCgroup]:
        """The task cgroups found below this agent's directory (after a restart)."""
        try:
            names = sorted(e.name for e in os.scandir(self.parents["pids"]) if e.is_dir())
        except OSError:
            return []
        return [self.task(name) for name in names]

    def owned(self, paths: Iterable[str]) -> TaskCgroup | None:
        """The task cgroup that `paths` (a launcher's `--cgroup`) name, when they are this
        agent's; else None (a path is taken from a process's arguments, never trusted)."""
        for text in paths:
            path = Path(text)
            if path.parent in self.parents.values():
                return self.task(path.name)
        return None


def find(key: str, mountinfo: Path = Path("/proc/self/mountinfo")) -> Hierarchy | str:
    """This machine's cgroup hierarchy for the agent `key`, or why there is none."""
    try:
        mounts = _mounts(mountinfo.read_text())
    except OSError as error:
        return f"cannot read {mountinfo}: {error.strerror}"
    for root in mounts.get("cgroup2", []):
        try:
            controllers = set((root / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if set(REQUIRED) <= controllers:
            return Hierarchy.v2(root, key)
    v1 = {name: paths[0] for name, paths in mounts.items() if name != "cgroup2"}
    missing = [name for name in REQUIRED if name not in v1]
    if missing:
        return f"no cgroup controller {', '.join(missing)} (v1) nor a v2 tree with them"
    return Hierarchy.v1(v1, key)


def roots(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Path]:
    """The root of every cgroup hierarchy mounted here (v1 and v2), each once."""
    try:
        mounts = _mounts(mountinfo.read_text())
    except OSError:
        return []
    return list(dict.fromkeys(path for paths in mounts.values() for path in paths))


def _below(top: Path) -> list[Path]:
    """`top` and the directories below it, each before those below it; [top] when it
    cannot be read (gone already)."""
    found = [top]
    for folder, names, _files in os.walk(top):
        found += [Path(folder) / name for name in sorted(names)]
    return found


def _mounts(text: str) -> dict[str, list[Path]]:
    """The mount points of cgroup v2 trees (under "cgroup2") and of each v1 controller,
    from /proc/self/mountinfo."""
    found: dict[str, list[Path]] = {}
    for line in text.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            found.setdefault("cgroup2", []).append(point)
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                found.setdefault(option, []).append(point)
    return found


def _quota(cores: float) -> int:
    """CPU cores as microseconds per CPU_PERIOD (0: no quota); the kernel's least is 1 ms."""
    return max(int(cores * CPU_PERIOD), 1000) if cores > 0 else 0


def _write(path: Path, value: object) -> None:
    with open(path, "w") as handle:
        handle.write(f"{value}\n")


def _field(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file ("oom_kill 1" lines) as a dict."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split() for line in lines)
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def _wait_for(path: Path, state: str) -> None:
    deadline = time.monotonic() + FREEZE_WAIT
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if path.read_text().strip() == state:
                return
        time.sleep(0.005)
