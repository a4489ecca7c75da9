"""Sampling this node's devices: NVML for real GPUs, what the tasks declare for virtual ones.

Every `interval` seconds each device gives one sample, attributed to the task that holds
it; a device shared by several tasks (fractions) gives one sample per task. Utilisation in
a task's sample is a percentage of the task's share of the device, so that
share * utilisation is the part of the device it used.

Real GPUs: device utilisation, memory, power and temperature from NVML; per process,
memory (nvmlDeviceGetComputeRunningProcesses) and, where the driver gives it, utilisation
(nvmlDeviceGetProcessUtilization). A process belongs to the task whose launcher leads its
process group. Where the driver gives no per-process utilisation, the tasks on a device
divide its utilisation in proportion to their shares. When NVML cannot be read, no sample
is made up: the device simply has none.

Virtual GPUs: a task declares its utilisation with corral.sdk.report_utilization, which
writes CORRAL_TELEMETRY_FILE; a declaration older than `stale` seconds, or none, counts as
0%. Such samples are labelled "declared", never "nvml".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.model.spec import Device
from corral.model.telemetry import Sample

log = logging.getLogger("corral.agent.telemetry")

DEFAULT_INTERVAL = 5.0
INTERVAL_ENV = "CORRAL_SAMPLE_INTERVAL"


def interval_from_env(default: float = DEFAULT_INTERVAL) -> float:
    """The sampling interval: CORRAL_SAMPLE_INTERVAL seconds when set, else `default`."""
    text = os.environ.get(INTERVAL_ENV)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}: {text!r} is not a number of seconds") from None
    if not 0.05 <= value <= 3600:
        raise ValueError(f"{INTERVAL_ENV}: {text!r} must be between 0.05 and 3600 seconds")
    return value


@dataclass(frozen=True, slots=True)
class Holder:
    """A running task as sampling needs it."""

    workload: str
    task: int
    devices: tuple[int, ...]
    gpu: float
    # The launcher's pid, which is also the process group of every process of the task.
    pgid: int
    started_at: float
    telemetry_file: str | None = None

    @property
    def share(self) -> float:
        """The part of each of its devices the task was given."""
        return self.gpu / len(self.devices) if self.devices else 0.0


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """One task's processes on one device: memory, and utilisation of the whole device
    (percent) when the driver reports it."""

    memory: int
    utilization: float | None


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One device as NVML reported it; `processes` by process group."""

    utilization: float
    memory_used: int
    memory_total: int
    power: float | None
    temperature: float | None
    processes: Mapping[int, ProcessReading]


def attribute_measured(
    now: float,
    node: str,
    device: int,
    reading: DeviceReading,
    holders: Sequence[Holder],
    seconds: float,
) -> list[Sample]:
    """Samples of a measured device: one for the device when free, else one per task."""

    def sample(
        workload: str | None, task: int | None, util: float, memory: int, share: float, span: float
    ) -> Sample:
        return Sample(
            time=now,
            node=node,
            device=device,
            workload=workload,
            task=task,
            utilization=round(min(max(util, 0.0), 100.0), 3),
            memory_used=memory,
            memory_total=reading.memory_total,
            power=reading.power,
            temperature=reading.temperature,
            source="nvml",
            share=share,
            seconds=span,
        )

    if not holders:
        return [sample(None, None, reading.utilization, reading.memory_used, 0.0, seconds)]
    total_share = sum(holder.share for holder in holders) or 1.0
    # Memory per process when the driver's processes could be told apart by task (not so
    # when the processes live in another pid namespace); else split by share.
    matched = any(holder.pgid in reading.processes for holder in holders)
    found = []
    for holder in holders:
        share = holder.share
        process = reading.processes.get(holder.pgid)
        if process is not None and process.utilization is not None and share > 0:
            util = process.utilization / share
        else:
            util = reading.utilization / total_share
        if matched:
            memory = process.memory if process is not None else 0
        else:
            memory = int(reading.memory_used * share / total_share)
        span = max(min(seconds, now - holder.started_at), 1e-3)
        found.append(sample(holder.workload, holder.task, util, memory, share, span))
    return found


def _read_small(path: str, limit: int = 4096) -> bytes:
    """A small regular file, read without following a symlink or waiting: the file is the
    task's, and a FIFO or a link to another file must not stall or mislead the agent."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read_declaration(path: str | None, now: float, since: float, stale: float) -> tuple[float, int]:
    """(utilisation, memory) a task declared in its telemetry file: (0, 0) when there is
    none, it cannot be read, it predates the task, or it is older than `stale` seconds."""
    if not path:
        return 0.0, 0
    try:
        data = json.loads(_read_small(path))
        at = float(data["time"])
        utilization = float(data["utilization"])
        memory = int(data.get("memory") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0, 0
    if at < since - 1.0 or now - at > stale:
        return 0.0, 0
    return min(max(utilization, 0.0), 100.0), max(memory, 0)


def attribute_declared(
    now: float,
    node: str,
    device: Device,
    holders: Sequence[Holder],
    seconds: float,
    stale: float,
    read: Callable[[str | None, float, float, float], tuple[float, int]] = read_declaration,
) -> list[Sample]:
    """Samples of a virtual device: what each task on it declared (0 when nothing lately)."""
    if not holders:
        free = Sample(
            time=now,
            node=node,
            device=device.index,
            workload=None,
            task=None,
            utilization=0.0,
            memory_used=0,
            memory_total=device.memory,
            power=None,
            temperature=None,
            source="none",
            share=0.0,
            seconds=seconds,
        )
        return [free]
    found = []
    for holder in holders:
        utilization, memory = read(holder.telemetry_file, now, holder.started_at, stale)
        found.append(
            Sample(
                time=now,
                node=node,
                device=device.index,
                workload=holder.workload,
                task=holder.task,
                utilization=utilization,
                memory_used=min(memory, device.memory),
                memory_total=device.memory,
                power=None,
                temperature=None,
                source="declared",
                share=holder.share,
                seconds=max(min(seconds, now - holder.started_at), 1e-3),
            )
        )
    return found


class Sampler:
    """Samples a node's devices every `interval` seconds. Thread-safe; a call that finds
    another one sampling returns nothing."""

    def __init__(self, node: str, devices: Sequence[Device], interval: float) -> None:
        self.node = node
        self.devices = tuple(devices)
        self.interval = interval
        # A declaration counts this long; tasks that report every few seconds stay fresh.
        self.stale = max(30.0, 3 * interval)
        self._last: float | None = None
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._process_stamps: dict[int, int] = {}
        if any(not device.virtual for device in self.devices):
            self._open_nvml()

    def _open_nvml(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as error:
            log.warning("NVML cannot be read (%s): real GPUs get no samples", error)
            return
        self._nvml = pynvml
        for device in self.devices:
            if device.virtual:
                continue
            try:
                self._handles[device.index] = pynvml.nvmlDeviceGetHandleByUUID(device.uuid)
            except pynvml.NVMLError as error:
                log.warning("GPU %s (%s) cannot be read: %s", device.index, device.uuid, error)

    def due(self, now: float) -> bool:
        return self._last is None or now - self._last >= self.interval

    def sample(self, now: float, holders: Sequence[Holder]) -> list[Sample]:
        if not self._lock.acquire(blocking=False):
            return []
        try:
            if not self.due(now):
                return []
            # One sample stands for the time since the previous one, but never for a long
            # gap (a stalled agent), where nothing is known.
            seconds = self.interval if self._last is None else now - self._last
            seconds = min(seconds, 3 * self.interval)
            self._last = now
            by_device: dict[int, list[Holder]] = defaultdict(list)
            for holder in holders:
                for index in holder.devices:
                    by_device[index].append(holder)
            found: list[Sample] = []
            for device in self.devices:
                on_it = sorted(by_device.get(device.index, []), key=lambda h: (h.workload, h.task))
                if device.virtual:
                    found.extend(
                        attribute_declared(now, self.node, device, on_it, seconds, self.stale)
                    )
                    continue
                reading = self._read(device.index)
                if reading is not None:
                    found.extend(
                        attribute_measured(now, self.node, device.index, reading, on_it, seconds)
                    )
            return found
        finally:
            self._lock.release()

    def _read(self, index: int) -> DeviceReading | None:
        nvml = self._nvml
        handle = self._handles.get(index)
        if nvml is None or handle is None:
            return None
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as error:
            log.debug("GPU %s: %s", index, error)
            return None
        power = temperature = None
        with contextlib.suppress(nvml.NVMLError):
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        with contextlib.suppress(nvml.NVMLError):
            temperature = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        return DeviceReading(
            utilization=float(rates.gpu),
            memory_used=int(memory.used),
            memory_total=int(memory.total),
            power=power,
            temperature=temperature,
            processes=self._processes(index, handle),
        )

    def _processes(self, index: int, handle: Any) -> dict[int, ProcessReading]:
        nvml = self._nvml
        memory: dict[int, int] = defaultdict(int)
        groups: dict[int, int] = {}
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError:
            running = []
        for process in running:
            group = _group_of(process.pid)
            if group is None:
                continue
            groups[process.pid] = group
            memory[group] += int(process.usedGpuMemory or 0)
        utilization: dict[int, float] | None = None
        try:
            stamp = self._process_stamps.get(index, 0)
            readings = nvml.nvmlDeviceGetProcessUtilization(handle, stamp)
        except nvml.NVMLError:
            readings = None
        if readings is not None:
            per_pid: dict[int, list[float]] = defaultdict(list)
            for reading in readings:
                per_pid[reading.pid].append(float(reading.smUtil))
                self._process_stamps[index] = max(
                    self._process_stamps.get(index, 0), int(reading.timeStamp)
                )
            utilization = defaultdict(float)
            for pid, values in per_pid.items():
                group = groups.get(pid) or _group_of(pid)
                if group is not None:
                    utilization[group] += sum(values) / len(values)
        return {
            group: ProcessReading(
                memory[group], None if utilization is None else utilization.get(group, 0.0)
            )
            for group in set(memory) | set(utilization or {})
        }

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
