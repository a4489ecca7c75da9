"""The store's records as the API's response bodies."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import orjson
from starlette.responses import Response

from corral.api.rules import rules_out
from corral.api.schemas.nodes import DeviceOut, NodeOut, TaskOnNodeOut
from corral.api.schemas.queues import Amounts, QueueOut, QueuePoolOut, WeightsOut
from corral.api.schemas.workloads import WorkloadOut
from corral.control.explain import weight_reason
from corral.model import Decisions, Queue
from corral.model.durations import lost_work_phrase
from corral.model.spec import KEY_SEPARATOR, PythonEnv, short_name
from corral.model.usage import DecaySetting
from corral.store import NodeRecord, QueueRecord, Store, WorkloadRecord
from corral.store.rules import RuleSet


def vars_of(record: Any) -> dict[str, Any]:
    """The fields of a slotted record, by name."""
    return {name: getattr(record, name) for name in record.__slots__}


def queue_out(
    record: QueueRecord,
    rules: RuleSet,
    last: Decisions | None,
    settings: Mapping[str, DecaySetting] | None = None,
) -> QueueOut:
    """A queue with its own rules and, after a first cycle, its share in the latest one;
    `settings` (time-decayed fair share, as inherited) word its effective weight."""
    queue = record.queue
    status = last.queues.get(queue.name) if last else None
    return QueueOut(
        name=queue.name,
        parent=queue.parent,
        department=record.department,
        children=list(record.children),
        deserved=Amounts.of(queue.deserved),
        limit=Amounts.of(queue.limit),
        over_quota_weight=WeightsOut.of(queue.over_quota_weight),
        priority=queue.priority,
        preempt_min_runtime=queue.preempt_min_runtime,
        reclaim_min_runtime=queue.reclaim_min_runtime,
        fair_share_half_life=queue.fair_share_half_life,
        fair_share_k=queue.fair_share_k,
        effective_weight=status.weight if status else None,
        usage=status.usage if status else None,
        weight_reason=weight_reason(queue, status, settings or {}),
        reserve_after=queue.reserve_after,
        fair_share=Amounts.of(status.fair_share) if status else None,
        allocated=Amounts.of(status.allocated) if status else None,
        requested=Amounts.of(status.requested) if status else None,
        pending_gpu=(max(status.requested.gpu - status.allocated.gpu, 0.0) if status else None),
        created_at=record.created_at,
        rules=rules_out(rules),
        pools=_pools_out(queue, last),
    )


def _pools_out(queue: Queue, last: Decisions | None) -> dict[str, QueuePoolOut]:
    """The queue in each pool it has a quota in or the latest cycle divided."""
    divided = last.pools if last else {}
    names = sorted(set(queue.pools) | set(divided))
    result = {}
    for pool in names:
        quota = queue.quota_in(pool)
        status = divided.get(pool, {}).get(queue.name)
        result[pool] = QueuePoolOut(
            deserved=Amounts.of(quota.deserved),
            limit=Amounts.of(quota.limit),
            own_quota=pool in queue.pools,
            fair_share=Amounts.of(status.fair_share) if status else None,
            allocated=Amounts.of(status.allocated) if status else None,
        )
    return result


def workload_fields(record: WorkloadRecord) -> dict[str, Any]:
    """A workload as plain data in the shape of `WorkloadOut`, field for field and in its
    order: its spec, where it stands, and where its tasks are placed. The one place a
    workload's answer is made: `workload_out` validates it into the model, and the busy
    handlers (submitting, reading, listing) send it as JSON at once (`json_answer`),
    without a model per workload and per task group (which cost a batch's workload about
    as much as writing it to the store: 39 us, now 7)."""
    spec = record.spec
    topology = spec.topology
    array = spec.array
    lost = record.lost_work
    return {
        "name": short_name(spec.name),
        "id": record.id,
        "directory": record.directory,
        "project": spec.project,
        "user": spec.user,
        "status": record.status,
        "reason": record.reason,
        "priority": spec.priority,
        "preemptible": spec.preemptible,
        "tasks": [
            {
                "name": group.name,
                "replicas": group.replicas,
                "gpu": float(group.gpu),
                "gpu_memory": group.gpu_memory,
                "cpu": float(group.cpu),
                "memory": group.memory,
            }
            for group in spec.task_groups
        ],
        "min_available": spec.min_available,
        "node_selector": {key: list(values) for key, values in spec.node_selector.items()},
        "node_pools": list(spec.node_pools),
        "topology": {"key": topology.key, "required": topology.required} if topology else None,
        "command": list(spec.command),
        "env": dict(spec.env),
        "secrets": dict(spec.secrets),
        "workdir": spec.workdir,
        "code": spec.code,
        "python": _python(spec.python),
        "image": spec.image,
        "max_runtime": _seconds(spec.max_runtime),
        "backoff_limit": spec.backoff_limit,
        "grace_period": float(spec.grace_period),
        "attempts": record.attempts,
        "failures": record.failures,
        "created_at": float(record.created_at),
        "started_at": _seconds(record.started_at),
        "pending_since": _seconds(record.waiting_since) if record.status == "pending" else None,
        "finished_at": _seconds(record.finished_at),
        "placements": [
            {
                "task": placement.task,
                "node": placement.node,
                "devices": list(placement.devices),
                "gpu": float(placement.gpu),
            }
            for placement in record.placements
        ],
        "exit_code": record.exit_code,
        "cancelled_by": record.cancelled_by,
        "array": (
            {"name": short_name(array.name), "index": array.index, "limit": array.limit}
            if array
            else None
        ),
        "after": [
            f"{within(dependency.workload, spec.project)}:{dependency.condition}"
            for dependency in spec.after
        ],
        "kill_on_invalid_dep": spec.kill_on_invalid_dep,
        "ports": [{"name": port.name, "base_url": port.base_url} for port in spec.ports],
        "checkpoint_at": _seconds(record.checkpoint_at),
        "lost_work": (
            None
            if lost is None
            else {
                "at": float(lost.at),
                "gpu_seconds": float(lost.gpu_seconds),
                "since": float(lost.since),
                "from_checkpoint": lost.from_checkpoint,
                "summary": lost_work_phrase(
                    lost.gpu_seconds, lost.at - lost.since, lost.from_checkpoint
                ),
            }
        ),
    }


# A workload's key in a reason: PROJECT/NAME, not part of a longer path or label.
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_KEY = re.compile(rf"(?<![\w./-])({_LABEL})/({_LABEL})\b")


class Redactor:
    """Reasons as `current` may read them: a reason names the workloads that took or hold
    GPUs (`reclaimed for team-b/x`), and a member reads "a workload of team-b" in place of
    a workload of a project they may not read, as `why` shows its holders."""

    def __init__(self, store: Store, readable: Collection[str] | None) -> None:
        self.readable = readable
        self._store = store
        self._projects: set[str] | None = None

    def __call__(self, text: str | None) -> str | None:
        if text is None or self.readable is None or KEY_SEPARATOR not in text:
            return text
        if self._projects is None:
            self._projects = self._store.queue_names()
        projects, readable = self._projects, self.readable

        def hidden(found: re.Match[str]) -> str:
            project = found.group(1)
            if project in projects and project not in readable:
                return f"a workload of {project}"
            return found.group(0)

        return _KEY.sub(hidden, text)

    def fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        """`workload_fields` of a workload with its reason as `current` may read it."""
        if self.readable is not None and fields.get("reason"):
            fields["reason"] = self(fields["reason"])
        return fields


def within(key: str, project: str) -> str:
    """A workload's key as seen from `project`: its name when it is of that project,
    PROJECT/NAME when of another."""
    return short_name(key) if key.startswith(f"{project}{KEY_SEPARATOR}") else key


def _python(python: PythonEnv | None) -> dict[str, Any] | None:
    # The files' names only: their text can be long, and the submitter has it.
    if python is None:
        return None
    return {
        "files": [name for name, _ in python.files],
        "version": python.version,
        "index_url": python.index_url,
        "find_links": list(python.find_links),
    }


def _seconds(value: float | None) -> float | None:
    # A float field is written as one (1.0, not 1), as the model writes it.
    return None if value is None else float(value)


def workload_out(record: WorkloadRecord, redact: Redactor | None = None) -> WorkloadOut:
    """A workload: its spec, where it stands, and where its tasks are placed (its reason
    as `redact` lets its reader see it)."""
    fields = workload_fields(record)
    return WorkloadOut.model_validate(redact.fields(fields) if redact else fields)


def json_answer(
    content: object, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A JSON answer of plain data (as `workload_fields` makes), written in one call. A
    handler that returns it keeps its `response_model` for the API's documentation; FastAPI
    sends a Response as it is."""
    return Response(orjson.dumps(content), status_code, headers, media_type="application/json")


def node_out(record: NodeRecord, readable: Collection[str] | None = None) -> NodeOut:
    """A node with its devices and the tasks on it; a task of a project outside
    `readable` (None: all) is shown without its workload's name."""
    node = record.node
    return NodeOut(
        name=node.name,
        gpus=node.gpus,
        gpu_model=node.gpu_model,
        gpu_memory=node.gpu_memory,
        cpu=node.cpu,
        memory=node.memory,
        labels=dict(node.labels),
        pool=node.pool,
        schedulable=node.schedulable,
        state=record.state,
        virtual=record.virtual,
        devices=[DeviceOut(**vars_of(device)) for device in record.devices],
        tasks=[
            TaskOnNodeOut(
                workload=short_name(t.workload)
                if readable is None or t.project in readable
                else None,
                project=t.project,
                task=t.task,
                devices=list(t.devices),
                gpu=t.gpu,
            )
            for t in record.tasks
        ],
        allocated_gpu=round(sum(task.gpu for task in record.tasks), 6),
        address=record.address,
        registered_at=record.registered_at,
        heartbeat_at=record.heartbeat_at,
    )
