"""What the cluster holds and uses right now, and its Prometheus exposition at /metrics.

Gauges are read from the store on every scrape (a custom collector), so they are never
stale; the scheduler's cycle duration (a histogram) and preemptions (a counter) are
observed as they happen. Each server has its own registry.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from corral.model import Decisions
from corral.model.telemetry import Sample, SampleSource
from corral.store import NodeRecord, QueueRecord, Store
from corral.store.telemetry_reads import latest_samples
from corral.store.usage import workload_counts

CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SchedulerMetrics:
    """The scheduler's own metrics: cycle duration, and preemptions by reason (the engine's
    action, or the rule that stopped the work)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cycle_seconds = Histogram(
            "corral_scheduler_cycle_seconds",
            "Duration of one scheduling cycle, snapshot to commit.",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.preemptions = Counter(
            "corral_preemptions",
            "Workloads taken off their devices, by reason: consolidate, reclaim, preempt "
            "(the engine), idle_timeout, max_runtime (queue rules).",
            ["reason"],
            registry=self.registry,
        )

    def cycle_done(self, seconds: float, decisions: Decisions) -> None:
        self.cycle_seconds.observe(seconds)
        for eviction in decisions.evictions:
            self.preemptions.labels(reason=eviction.action).inc()

    def rule_applied(self, rule: str) -> None:
        self.preemptions.labels(reason=rule).inc()


# -- the cluster now ----------------------------------------------------------------------


@dataclass
class DeviceNow:
    """One device: who holds it and its latest samples (one per task on a shared device)."""

    node: str
    device: int
    model: str
    virtual: bool
    memory_total: int
    workloads: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return bool(self.workloads)

    @property
    def task_samples(self) -> list[Sample]:
        """Samples of the tasks that hold the device now."""
        return [s for s in self.samples if s.workload is not None and s.workload in self.workloads]

    @property
    def used(self) -> float:
        """Devices' worth of compute its holders use (0 to 1)."""
        return min(sum(sample.gpus_used for sample in self.task_samples), 1.0)

    @property
    def utilization(self) -> float | None:
        """Percent of the whole device in use, when there is a sample."""
        if not self.samples:
            return None
        if not self.held:
            free = [s for s in self.samples if s.workload is None]
            return free[0].utilization if free else 0.0
        return round(self.used * 100.0, 3) if self.task_samples else None

    @property
    def memory_used(self) -> int | None:
        if not self.samples:
            return None
        if not self.held:
            return max(sample.memory_used for sample in self.samples)
        return sum(sample.memory_used for sample in self.task_samples)

    @property
    def source(self) -> SampleSource:
        sources = [sample.source for sample in self.samples]
        for kind in ("nvml", "declared"):
            if kind in sources:
                return kind
        return "none"

    @property
    def power(self) -> float | None:
        return next((s.power for s in self.samples if s.power is not None), None)

    @property
    def temperature(self) -> float | None:
        return next((s.temperature for s in self.samples if s.temperature is not None), None)

    @property
    def state(self) -> str:
        """free (nobody holds it), idle (held, latest samples at 0%) or busy."""
        if not self.held:
            return "free"
        utilization = self.utilization
        return "idle" if utilization is not None and utilization == 0 else "busy"


@dataclass
class Now:
    """Allocated and used GPUs by node, project and department, and every device."""

    devices: list[DeviceNow]
    nodes: list[NodeRecord]
    queues: list[QueueRecord]
    node_allocated: dict[str, float]
    node_used: dict[str, float]
    project_allocated: dict[str, float]
    project_used: dict[str, float]
    department_allocated: dict[str, float]
    department_used: dict[str, float]


def now_state(store: Store, now: float | None = None) -> Now:
    """The cluster as of the latest samples."""
    now = time.time() if now is None else now
    nodes = store.list_nodes()
    queues = store.list_queues()
    samples = latest_samples(store, now)
    by_device: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for sample in samples:
        by_device[(sample.node, sample.device)].append(sample)
    parents = {record.queue.name: record.queue.parent for record in queues}
    devices = []
    node_allocated: dict[str, float] = {}
    node_used: dict[str, float] = {}
    project_allocated: dict[str, float] = defaultdict(float)
    project_used: dict[str, float] = defaultdict(float)
    project_of: dict[str, str] = {}
    for record in nodes:
        name = record.node.name
        node_allocated[name] = round(sum(task.gpu for task in record.tasks), 6)
        for task in record.tasks:
            project_allocated[task.project] += task.gpu
            project_of[task.workload] = task.project
        used = 0.0
        for device in record.devices:
            holders = sorted({t.workload for t in record.tasks if device.index in t.devices})
            state = DeviceNow(
                name,
                device.index,
                device.model,
                device.virtual,
                device.memory,
                holders,
                by_device.get((name, device.index), []),
            )
            devices.append(state)
            used += state.used
            for sample in state.task_samples:
                project = project_of.get(sample.workload or "")
                if project is not None:
                    project_used[project] += sample.gpus_used
        node_used[name] = round(used, 6)
    department_allocated: dict[str, float] = defaultdict(float)
    department_used: dict[str, float] = defaultdict(float)
    for queue in queues:
        if queue.department:
            department_allocated[queue.queue.name] += 0.0
            department_used[queue.queue.name] += 0.0
        else:
            project_allocated[queue.queue.name] += 0.0
            project_used[queue.queue.name] += 0.0
    for project in list(project_allocated):
        parent = parents.get(project)
        while parent is not None:
            department_allocated[parent] += project_allocated[project]
            department_used[parent] += project_used[project]
            parent = parents.get(parent)
    return Now(
        devices,
        nodes,
        queues,
        node_allocated,
        node_used,
        _rounded(project_allocated),
        _rounded(project_used),
        _rounded(department_allocated),
        _rounded(department_used),
    )


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 6) for key, value in sorted(values.items())}


# -- the collector ------------------------------------------------------------------------


class LatestCycle(Protocol):
    """What the collector reads of the scheduler loop: the latest cycle's decisions.

    A protocol rather than the loop's class, so that the loop (which owns a
    SchedulerMetrics) and this module do not import each other."""

    @property
    def last(self) -> Decisions | None:
        """The decisions of the latest cycle; None before the first."""


class StateCollector(Collector):
    """Gauges read from the store on every scrape."""

    def __init__(self, store: Store, loop: LatestCycle) -> None:
        self.store = store
        self.loop = loop

    def describe(self) -> list[Metric]:
        # Described as nothing, so that registering does not query the store.
        return []

    def collect(self) -> Iterator[Metric]:
        state = now_state(self.store)
        yield _gauge(
            "corral_node_gpus",
            "GPUs of the node.",
            "node",
            {record.node.name: record.node.gpus for record in state.nodes},
        )
        yield _gauge(
            "corral_node_gpus_allocated",
            "GPUs of the node held by tasks.",
            "node",
            state.node_allocated,
        )
        yield _gauge(
            "corral_node_gpus_used",
            "Devices' worth of compute the node's tasks use (share x utilisation).",
            "node",
            state.node_used,
        )
        yield _gauge(
            "corral_project_gpus_allocated",
            "GPUs held by the project's tasks.",
            "project",
            state.project_allocated,
        )
        yield _gauge(
            "corral_project_gpus_used",
            "GPUs' worth of compute the project's tasks use.",
            "project",
            state.project_used,
        )
        yield _gauge(
            "corral_department_gpus_allocated",
            "GPUs held by the department's projects.",
            "department",
            state.department_allocated,
        )
        yield _gauge(
            "corral_department_gpus_used",
            "GPUs' worth of compute the department's projects use.",
            "department",
            state.department_used,
        )
        yield from self._queues(state.queues)
        counts = workload_counts(self.store)
        yield _gauge("corral_workloads", "Workloads by status.", "status", counts)
        utilization = GaugeMetricFamily(
            "corral_device_utilization_percent",
            "Latest utilisation of each device (declared on virtual devices).",
            labels=["node", "device", "source"],
        )
        memory = GaugeMetricFamily(
            "corral_device_memory_used_bytes",
            "Latest memory in use on each device.",
            labels=["node", "device"],
        )
        for device in state.devices:
            if device.utilization is not None:
                utilization.add_metric(
                    [device.node, str(device.device), device.source], device.utilization
                )
            if device.memory_used is not None:
                memory.add_metric([device.node, str(device.device)], device.memory_used)
        yield utilization
        yield memory

    def _queues(self, queues: list[QueueRecord]) -> Iterator[Metric]:
        deserved = {record.queue.name: record.queue.deserved.gpu for record in queues}
        yield _gauge("corral_queue_deserved_gpus", "GPUs the queue deserves.", "queue", deserved)
        last = self.loop.last
        statuses = last.queues if last is not None else {}
        fair = GaugeMetricFamily(
            "corral_queue_fair_share_gpus",
            "The queue's fair share of GPUs in the latest cycle.",
            labels=["queue"],
        )
        allocated = GaugeMetricFamily(
            "corral_queue_allocated_gpus",
            "GPUs allocated to the queue in the latest cycle.",
            labels=["queue"],
        )
        pending = GaugeMetricFamily(
            "corral_queue_pending_gpus",
            "GPUs the queue's waiting work asks for beyond what it holds (pending demand).",
            labels=["queue"],
        )
        for name in sorted(statuses):
            status = statuses[name]
            if math.isfinite(status.fair_share.gpu):
                fair.add_metric([name], status.fair_share.gpu)
            allocated.add_metric([name], status.allocated.gpu)
            pending.add_metric([name], max(status.requested.gpu - status.allocated.gpu, 0.0))
        yield fair
        yield allocated
        yield pending


def _gauge(name: str, help_text: str, label: str, values: Mapping[str, float]) -> Metric:
    family = GaugeMetricFamily(name, help_text, labels=[label])
    for key in sorted(values):
        family.add_metric([key], float(values[key]))
    return family
