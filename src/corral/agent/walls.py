"""The walls an agent puts around each task (docs/security.md): a cgroup with its limits
(corral.agent.cgroups), a process namespace (corral.agent.namespaces), a wall around the
ports it is given (corral.agent.portwall) and a cap on its log (corral.agent.logcap).

Limits need root and the cgroup controllers; a process namespace needs root and a
kernel that allows it; the port wall needs root and nftables. Without them (`corral up`
on a laptop) tasks run as before, and `corral up` says which walls are off and why. The
log cap holds everywhere.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from corral.agent import cgroups, namespaces, portwall
from corral.agent.cgroups import Hierarchy, Limits, TaskCgroup
from corral.agent.logcap import DEFAULT_LOG_CAP
from corral.agent.portwall import PortWall
from corral.messages import TaskLaunch
from corral.model import format_memory
from corral.model.spec import Device

log = logging.getLogger("corral.agent")

# Processes and threads a task may have at once: a fork bomb stops there, and a training
# job with many data loader workers and their threads stays well below.
DEFAULT_PIDS = 4096


@dataclass(frozen=True, slots=True)
class WallOptions:
    """What an operator chooses (`corral up --log-cap --task-pids`): the log cap in bytes
    and the pids limit of every task; `limits` False turns cgroups and namespaces off."""

    log_cap: int = DEFAULT_LOG_CAP
    pids: int = DEFAULT_PIDS
    limits: bool = True


class Walls:
    """One agent's walls: where task cgroups go (None: limits are off, `off` says why),
    whether tasks get a process namespace, and what a task's limits are."""

    def __init__(
        self, data_dir: Path, devices: tuple[Device, ...], options: WallOptions | None = None
    ) -> None:
        options = options or WallOptions()
        self.options = options
        self.devices = devices
        self.memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.minors = nvidia_minors(devices)
        self.hierarchy: Hierarchy | None = None
        self.off: str | None = None
        self.namespace = False
        # The wall around the ports tasks are given (None: open, `ports_off` says why).
        self.ports: PortWall | None = None
        self.ports_off: str | None = None
        if not options.limits:
            self.off = self.ports_off = "turned off (--no-task-limits)"
        elif os.geteuid() != 0:
            self.off = self.ports_off = "corral does not run as root"
        else:
            key = cgroups.agent_key(data_dir)
            found = _prepared(cgroups.find(key))
            self.hierarchy, self.off = (None, found) if isinstance(found, str) else (found, None)
            why = namespaces.available()
            self.namespace = why is None
            if why is not None:
                log.warning("tasks get no process namespace of their own: %s", why)
            self.ports, self.ports_off = _port_wall(key)

    def describe(self) -> list[str]:
        """What `corral up` says of its tasks' walls."""
        if self.hierarchy is None:
            limits = f"limits are off: {self.off}; tasks have no memory, CPU or pids limit"
        else:
            limits = (
                f"task limits: {self.hierarchy.describe()}: memory, CPU and at most "
                f"{self.options.pids} processes per task"
            )
        seen = "its own processes only" if self.namespace else "every process of the machine"
        cap = f"task logs keep their last {format_memory(self.options.log_cap)}"
        if self.ports is not None:
            ports = "the ports a task is given answer only its own account and corral"
        else:
            ports = f"the ports a task is given answer every process ({self.ports_off})"
        return [f"{limits}; each task sees {seen}; {ports}; {cap}"]

    def limits(self, launch: TaskLaunch) -> Limits:
        """The task's limits: what it asked for; memory it did not ask for is the node's
        memory per GPU, for each GPU it holds (one for a fraction or none)."""
        memory = launch.memory
        if memory <= 0:
            per_gpu = self.memory // max(len(self.devices), 1)
            memory = per_gpu * max(1, math.ceil(launch.gpu))
        own = set(launch.devices)
        denied = tuple(sorted(m for index, m in self.minors.items() if index not in own))
        if launch.image is not None:
            # In a container, runc's own device list holds (only the task's GPUs are given
            # to it), and a denial here would forbid runc to set it up below this cgroup.
            denied = ()
        return Limits(memory, launch.cpu, self.options.pids, denied)

    def cgroup(self, launch: TaskLaunch) -> TaskCgroup | None:
        """The launch's cgroup (made or not); None when limits are off."""
        if self.hierarchy is None:
            return None
        return self.hierarchy.task(_label(launch))

    def launcher_options(self, cgroup: TaskCgroup | None) -> tuple[str, ...]:
        """What the launcher is told of the walls it builds."""
        options = ["--log-cap", str(self.options.log_cap)]
        if cgroup is not None:
            options += ["--cgroup", ":".join(str(path) for path in cgroup.paths())]
        if self.namespace:
            options += ["--namespace", "pid"]
        return tuple(options)

    def wall_ports(self, launch: TaskLaunch, ports: Iterable[int], uid: int) -> None:
        """Let only the task's account `uid` and corral reach its `ports` (nothing to do
        when the wall is off). PortWallError when nftables refuses."""
        if self.ports is not None:
            self.ports.wall(ports, uid, _label(launch))

    def open_ports(self, launch: TaskLaunch) -> None:
        """The task has ended: its ports are walled no more."""
        if self.ports is None or not launch.ports:
            return
        try:
            self.ports.open(_label(launch))
        except portwall.PortWallError as error:
            log.warning("cannot open the ports of %s/%s: %s", launch.workload, launch.task, error)

    def servers(self, addresses: Iterable[str]) -> None:
        """The server's hosts, which reach walled ports from other machines."""
        if self.ports is None:
            return
        try:
            self.ports.servers(addresses)
        except (portwall.PortWallError, ValueError) as error:
            log.warning("the server's addresses %s are not let in: %s", list(addresses), error)

    def close(self) -> None:
        """Remove this agent's own cgroup directories if no task's is left in them, and its
        port wall if no port is walled in it (tasks outlive their agent; a restarted one
        finds them again)."""
        if self.hierarchy is not None:
            for path in dict.fromkeys(self.hierarchy.parents.values()):
                with contextlib.suppress(OSError):
                    path.rmdir()
        if self.ports is not None:
            with contextlib.suppress(portwall.PortWallError):
                self.ports.close()

    def leftovers(self, claimed: Iterable[TaskCgroup | None]) -> list[TaskCgroup]:
        """The task cgroups of this agent found from before it started that no live
        launcher `claimed`: their tasks have ended, and what they left is killed."""
        if self.hierarchy is None:
            return []
        names = {cgroup.name for cgroup in claimed if cgroup is not None}
        found = [cgroup for cgroup in self.hierarchy.tasks() if cgroup.name not in names]
        for cgroup in found:
            if cgroup.processes():
                log.warning("killing what task %s left behind", cgroup.name)
        return found


def _port_wall(key: str) -> tuple[PortWall | None, str | None]:
    """The agent's port wall, its table made; or why there is none."""
    why = portwall.available()
    if why is not None:
        log.warning("the ports given to tasks are not walled: %s", why)
        return None, why
    wall = PortWall(key)
    try:
        wall.prepare()
    except portwall.PortWallError as error:
        log.warning("the ports given to tasks are not walled: %s", error)
        return None, f"nftables refused its table: {error}"
    return wall, None


def _label(launch: TaskLaunch) -> str:
    """What a task's walled ports are found by: the name of its cgroup."""
    return cgroups.task_name(launch.directory, launch.task, launch.launch, launch.attempt)


def _prepared(found: Hierarchy | str) -> Hierarchy | str:
    """The hierarchy, its agent's directories made; or why there is none."""
    if isinstance(found, str):
        return found
    try:
        found.prepare()
    except OSError as error:
        return f"cannot make cgroups under {found.parents['pids']}: {error}"
    return found


def out_of_memory(cgroup: TaskCgroup) -> str | None:
    """The end reason of a task whose processes the kernel killed for its memory limit."""
    if cgroup.oom_kills() == 0:
        return None
    limit = cgroup.memory_limit()
    shown = format_memory(limit) if limit is not None else "unknown"
    # "512MiB" reads "512 MiB": the unit apart, as people write it.
    number = shown.rstrip("KMGTiB")
    return f"out of memory: limit {number} {shown[len(number) :]}"


def nvidia_minors(devices: tuple[Device, ...]) -> dict[int, int]:
    """Each device's minor number (/dev/nvidiaN is 195:N) by its index: the driver's, by
    UUID, where it tells; else the index (virtual devices, which have no device file)."""
    by_uuid: dict[str, int] = {}
    for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
        try:
            lines = info.read_text().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        uuid, minor = fields.get("GPU UUID", "").strip(), fields.get("Device Minor", "").strip()
        if uuid and minor.isdigit():
            by_uuid[uuid] = int(minor)
    return {device.index: by_uuid.get(device.uuid, device.index) for device in devices}
