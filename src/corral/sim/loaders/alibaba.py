"""Alibaba's GPU trace of 2023, "openb" (`alibaba-gpu-v2023/`).

Node lists: `sn`, `cpu_milli`, `memory_mib`, `gpu`, `model`. Pod lists: `name`,
`cpu_milli`, `memory_mib`, `num_gpu`, `gpu_milli` (a share of one GPU in thousandths,
below 1000 only for single-GPU pods), and in most variants `gpu_spec` (allowed GPU models
joined by "|"), `qos` and the times `creation_time`, `deletion_time`, `scheduled_time`.

Replayed in time, a pod arrives at its creation and runs from its scheduling (or creation)
to its deletion. QoS becomes priority: latency-sensitive (LS) and Guaranteed pods are
non-preemptible interactive work, Burstable pods preemptible at 75, best-effort (BE) pods
preemptible training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from corral.model import PRIORITY_CLASSES, Node, TaskGroup
from corral.model.resources import MIB
from corral.sim.errors import SimError
from corral.sim.loaders.csvfile import Row, read_rows
from corral.sim.trace import Job, Trace

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")
POD_OPTIONAL = ("gpu_spec", "qos")

NODE_LIST = "openb_node_list_gpu_node.csv"
# The model of a node without GPUs, so that no GPU-model selector ever matches it.
NO_GPU_MODEL = "none"

_QOS: dict[str, tuple[int, bool]] = {
    "LS": (PRIORITY_CLASSES["interactive"], False),
    "Guaranteed": (PRIORITY_CLASSES["interactive"], False),
    "Burstable": (PRIORITY_CLASSES["interactive-preemptible"], True),
    "BE": (PRIORITY_CLASSES["train"], True),
}


@dataclass(frozen=True, slots=True)
class Pod:
    """One pod's request: CPU cores, memory (bytes), GPUs and, for a single-GPU pod, the
    share of the GPU in thousandths; `gpu_models` lists the models it may use (empty: any)."""

    name: str
    cpu: float
    memory: int
    gpus: int
    gpu_milli: int
    gpu_models: tuple[str, ...] = ()
    qos: str = ""

    @property
    def gpu(self) -> float:
        """GPUs per task: whole devices, or the fraction of one."""
        if self.gpus == 1 and self.gpu_milli < 1000:
            return self.gpu_milli / 1000
        return float(self.gpus)

    def task_group(self) -> TaskGroup:
        return TaskGroup(replicas=1, gpu=self.gpu, cpu=self.cpu, memory=self.memory)


def load_openb_nodes(path: Path) -> tuple[Node, ...]:
    """The nodes of a node list, in file order."""
    nodes = []
    for row in read_rows(path, NODE_COLUMNS):
        gpus = _whole(row, "gpu")
        model = row.text("model") or NO_GPU_MODEL
        nodes.append(
            Node(
                name=row.text("sn"),
                gpus=gpus,
                gpu_model=model if gpus else NO_GPU_MODEL,
                cpu=row.number("cpu_milli") / 1000,
                memory=int(row.number("memory_mib")) * MIB,
            )
        )
    if not nodes:
        raise SimError(path.name, "the file has no nodes")
    return tuple(nodes)


def load_openb_pods(path: Path) -> tuple[Pod, ...]:
    """The pods of a pod list (any variant), in file order."""
    return tuple(_pod(row) for row in read_rows(path, POD_COLUMNS, POD_OPTIONAL))


def _pod(row: Row) -> Pod:
    gpus = _whole(row, "num_gpu")
    milli = _whole(row, "gpu_milli")
    if gpus and not 0 < milli <= 1000:
        raise row.error("gpu_milli", f"{milli} is not between 1 and 1000")
    if gpus > 1 and milli != 1000:
        raise row.error("gpu_milli", f"a pod with {gpus} GPUs cannot share them ({milli})")
    spec = row.text("gpu_spec")
    return Pod(
        name=row.text("name"),
        cpu=row.number("cpu_milli") / 1000,
        memory=int(row.number("memory_mib")) * MIB,
        gpus=gpus,
        gpu_milli=milli if gpus else 0,
        gpu_models=tuple(model for model in spec.split("|") if model) if spec else (),
        qos=row.text("qos"),
    )


def load_openb(pods: Path, nodes: Path, project: str = "openb") -> Trace:
    """A pod list replayed in time on the nodes of a node list; every pod is in `project`."""
    cluster = load_openb_nodes(nodes)
    jobs = []
    for row in read_rows(pods, (*POD_COLUMNS, *TIME_COLUMNS), POD_OPTIONAL):
        pod = _pod(row)
        created = row.number("creation_time")
        scheduled = row.optional_number("scheduled_time")
        duration = row.number("deletion_time") - (created if scheduled is None else scheduled)
        if duration <= 0:
            continue
        priority, preemptible = _QOS.get(pod.qos, _QOS["BE"])
        jobs.append(
            Job(
                name=pod.name,
                project=project,
                submitted=created,
                duration=duration,
                task_groups=(pod.task_group(),),
                priority=priority,
                preemptible=preemptible,
                gpu_models=pod.gpu_models,
            )
        )
    if not jobs:
        raise SimError(pods.name, "the file has no pods that ran")
    jobs.sort(key=lambda job: (job.submitted, job.name))
    span = max(job.submitted for job in jobs)
    return Trace("openb", str(pods), tuple(jobs), span, nodes=cluster)


def _whole(row: Row, column: str) -> int:
    value = row.number(column)
    if value < 0 or value != int(value):
        raise row.error(column, f"{value:g} is not a whole number")
    return int(value)
