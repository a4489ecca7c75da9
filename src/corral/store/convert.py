"""Rows to records and back: what the store hands out is plain values, never ORM rows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.model import Node, Placement, PoolQuota, Queue, Resources, TaskGroup, Topology
from corral.model.arrays import ArrayMember, Dependency
from corral.model.spec import Device, PortSpec, PythonEnv, WorkloadSpec, directory_name
from corral.store.database import json_text
from corral.store.records import LostWork, NodeRecord, QueueRecord, TaskOnNode, WorkloadRecord
from corral.store.schema import NodeRow, PlacementRow, QueueRow, WorkloadRow

# -- queues ---------------------------------------------------------------------------------


def fill_queue(row: QueueRow, queue: Queue) -> None:
    """Write the queue's amounts, priority and min-runtimes into its row (unlimited
    amounts as NULL)."""
    row.deserved_gpu = queue.deserved.gpu
    row.deserved_cpu = _optional(queue.deserved.cpu)
    row.deserved_memory = _int_or_none(queue.deserved.memory)
    row.limit_gpu = _optional(queue.limit.gpu)
    row.limit_cpu = _optional(queue.limit.cpu)
    row.limit_memory = _int_or_none(queue.limit.memory)
    row.weight_gpu = queue.over_quota_weight.gpu
    row.weight_cpu = queue.over_quota_weight.cpu
    row.weight_memory = queue.over_quota_weight.memory
    row.priority = queue.priority
    row.preempt_min_runtime = queue.preempt_min_runtime
    row.reclaim_min_runtime = queue.reclaim_min_runtime
    row.fair_share_half_life = queue.fair_share_half_life
    row.fair_share_k = queue.fair_share_k

    row.pools = pools_json(queue.pools) or None

    row.reserve_after = queue.reserve_after


def queue_from_row(row: QueueRow, names: dict[int, str]) -> Queue:
    """The queue of a row; `names` maps queue ids to names (for the parent)."""
    return Queue(
        name=row.name,
        parent=names[row.parent_id] if row.parent_id is not None else None,
        deserved=Resources(
            row.deserved_gpu, _or_inf(row.deserved_cpu), _or_inf(row.deserved_memory)
        ),
        limit=Resources(_or_inf(row.limit_gpu), _or_inf(row.limit_cpu), _or_inf(row.limit_memory)),
        over_quota_weight=Resources(row.weight_gpu, row.weight_cpu, row.weight_memory),
        priority=row.priority,
        preempt_min_runtime=row.preempt_min_runtime,
        reclaim_min_runtime=row.reclaim_min_runtime,
        fair_share_half_life=row.fair_share_half_life,
        fair_share_k=row.fair_share_k,
        pools=pools_of_json(row.pools),
        reserve_after=row.reserve_after,
    )


def pools_json(pools: Mapping[str, PoolQuota]) -> dict[str, Any]:
    """A queue's quotas by pool as JSON (unlimited amounts as null)."""
    return {
        pool: {"deserved": _amounts_json(quota.deserved), "limit": _amounts_json(quota.limit)}
        for pool, quota in pools.items()
    }


def pools_of_json(value: Mapping[str, Any] | None) -> dict[str, PoolQuota]:
    """A queue's quotas by pool from their JSON."""
    return {
        pool: PoolQuota(_amounts_of(quota["deserved"]), _amounts_of(quota["limit"]))
        for pool, quota in (value or {}).items()
    }


def _amounts_json(amounts: Resources) -> list[float | None]:
    return [_optional(amounts.gpu), _optional(amounts.cpu), _optional(amounts.memory)]


def _amounts_of(value: list[float | None]) -> Resources:
    gpu, cpu, memory = (_or_inf(amount) for amount in value)
    return Resources(gpu, cpu, memory)


def queue_names(session: Session) -> dict[int, str]:
    """Every queue's name by its id."""
    return dict(session.execute(select(QueueRow.id, QueueRow.name)).all())


def queue_record(session: Session, row: QueueRow) -> QueueRecord:
    """The queue of a row with its children's names."""
    children = session.scalars(
        select(QueueRow.name).where(QueueRow.parent_id == row.id).order_by(QueueRow.id)
    ).all()
    return QueueRecord(queue_from_row(row, queue_names(session)), tuple(children), row.created_at)


def _optional(value: float) -> float | None:
    return None if math.isinf(value) else value


def _int_or_none(value: float) -> int | None:
    return None if math.isinf(value) else int(value)


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else float(value)


# -- nodes ----------------------------------------------------------------------------------


def node_placements(session: Session, row: NodeRow) -> list[PlacementRow]:
    """The placements of tasks on the node."""
    return list(session.scalars(select(PlacementRow).where(PlacementRow.node_id == row.id)).all())


def node_of(row: Any, gpus: int) -> Node:
    """The engine's node of a `nodes` row (an ORM row or a plain one), with `gpus` devices."""
    return Node(
        name=row.name,
        gpus=gpus,
        gpu_memory=row.gpu_memory,
        gpu_model=row.gpu_model,
        cpu=row.cpu,
        memory=row.memory,
        labels=dict(row.labels),
        schedulable=row.schedulable,
    )


def node_record(session: Session, row: NodeRow) -> NodeRecord:
    """The node of a row with its devices and the tasks placed on it."""
    tasks = []
    for placement in node_placements(session, row):
        workload = placement.workload
        tasks.append(
            TaskOnNode(
                workload.name,
                workload.queue.name,
                placement.task,
                tuple(placement.devices),
                placement.gpu,
            )
        )
    node = node_of(row, len(row.devices))
    return NodeRecord(
        node=node,
        devices=tuple(Device(d.index, d.uuid, d.model, d.memory, d.virtual) for d in row.devices),
        virtual=row.virtual,
        state=row.state,
        registered_at=row.registered_at,
        heartbeat_at=row.heartbeat_at,
        tasks=tuple(sorted(tasks, key=lambda t: (t.devices, t.workload, t.task))),
        address=row.address,
    )


# -- workloads ------------------------------------------------------------------------------


# The columns of a new workload's row, in the order `workload_values` gives them.
WORKLOAD_COLUMNS = (
    "name",
    "queue_id",
    "user",
    "priority",
    "preemptible",
    "min_available",
    "node_selector",
    "node_pools",
    "topology_key",
    "topology_required",
    "command",
    "env",
    "secrets",
    "workdir",
    "max_runtime",
    "backoff_limit",
    "grace_period",
    "ports",
    "code",
    "python",
    "image",
    "status",
    "reason",
    "attempts",
    "failures",
    "created_at",
    "array_name",
    "array_index",
    "array_limit",
    "after",
    "kill_on_invalid_dep",
    "held",
)


def workload_values(spec: WorkloadSpec, queue_id: int, at: float) -> tuple[Any, ...]:
    """A new pending workload's row (`WORKLOAD_COLUMNS`), in the driver's types, for
    `corral.store.bulk.Rows`."""
    array = spec.array
    return (
        spec.name,
        queue_id,
        spec.user,
        spec.priority,
        spec.preemptible,
        spec.min_available,
        json_text({key: list(values) for key, values in spec.node_selector.items()}),
        json_text(list(spec.node_pools) or None),
        spec.topology.key if spec.topology else None,
        spec.topology.required if spec.topology else True,
        json_text(list(spec.command)),
        json_text(dict(spec.env)),
        json_text(dict(spec.secrets)),
        spec.workdir,
        spec.max_runtime,
        spec.backoff_limit,
        spec.grace_period,
        json_text([{"name": p.name, "base_url": p.base_url} for p in spec.ports]),
        spec.code,
        json_text(python_json(spec.python)),
        spec.image,
        "pending",
        waiting_reason(spec),
        0,
        0,
        at,
        array.name if array else None,
        array.index if array else None,
        array.limit if array else None,
        json_text([[d.workload, d.condition] for d in spec.after] if spec.after else None),
        spec.kill_on_invalid_dep,
        # Released by the first cycle that finds every dependency met (even at once).
        bool(spec.after),
    )


def waiting_reason(spec: WorkloadSpec) -> str | None:
    """What a new workload waits for before the scheduler considers it, if anything."""
    if spec.after:
        return "waiting for " + ", ".join(map(dependency_text, spec.after))
    if spec.array is not None:
        return array_reason(spec.array.name, spec.array.limit)
    return None


def array_reason(array: str, limit: int | None) -> str | None:
    """Why a member of an array with a running limit may wait for a slot."""
    if limit is None:
        return None
    return f"array {array} runs at most {limit} at once; waiting for a slot"


def dependency_text(dependency: Dependency) -> str:
    """`train-1 to succeed` or `train-1 to end`."""
    goal = "succeed" if dependency.condition == "ok" else "end"
    return f"{dependency.workload} to {goal}"


def workload_spec(row: WorkloadRow, project: str) -> WorkloadSpec:
    """The spec a workload row was submitted with."""
    return spec_of(row, project, _task_groups(row))


def _task_groups(row: WorkloadRow) -> tuple[TaskGroup, ...]:
    return tuple(
        TaskGroup(g.name, g.replicas, g.gpu, g.gpu_memory, g.cpu, g.memory) for g in row.task_groups
    )


def spec_of(row: Any, project: str, task_groups: tuple[TaskGroup, ...]) -> WorkloadSpec:
    """The spec of a workload's columns (an ORM row, or a plain row of a select of every
    column of `workloads`), with its task groups."""
    return WorkloadSpec(
        name=row.name,
        project=project,
        user=row.user,
        task_groups=task_groups,
        priority=row.priority,
        preemptible=row.preemptible,
        min_available=row.min_available,
        node_selector={key: tuple(values) for key, values in row.node_selector.items()},
        topology=Topology(row.topology_key, row.topology_required) if row.topology_key else None,
        node_pools=tuple(row.node_pools or ()),
        command=tuple(row.command),
        env=dict(row.env),
        secrets=dict(row.secrets or {}),
        workdir=row.workdir,
        max_runtime=row.max_runtime,
        backoff_limit=row.backoff_limit,
        grace_period=row.grace_period,
        after=tuple(
            Dependency(name, "any" if cond == "any" else "ok") for name, cond in row.after or ()
        ),
        kill_on_invalid_dep=row.kill_on_invalid_dep,
        array=(
            ArrayMember(row.array_name, row.array_index or 0, row.array_limit)
            if row.array_name is not None
            else None
        ),
        ports=tuple(PortSpec(p["name"], bool(p.get("base_url"))) for p in row.ports or ()),
        code=row.code,
        python=python_of(row.python),
        image=row.image,
    )


def python_json(python: PythonEnv | None) -> dict[str, Any] | None:
    """A workload's Python environment as its JSON column keeps it."""
    if python is None:
        return None
    return {
        "files": [list(pair) for pair in python.files],
        "version": python.version,
        "index_url": python.index_url,
        "find_links": list(python.find_links),
    }


def python_of(value: Mapping[str, Any] | None) -> PythonEnv | None:
    """The Python environment of a workload's JSON column (`python_json`)."""
    if not value:
        return None
    return PythonEnv(
        files=tuple((str(name), str(text)) for name, text in value.get("files") or ()),
        version=value.get("version"),
        index_url=value.get("index_url"),
        find_links=tuple(value.get("find_links") or ()),
    )


def directory_of(row: WorkloadRow) -> str:
    """The name of the row's workload's directories (WorkloadRecord.directory)."""
    return directory_name(row.name, None if row.dirs_by_name else row.id)


def workload_record(row: WorkloadRow, project: str) -> WorkloadRecord:
    """The workload of a row in queue `project`, with its placements."""
    return record_of(
        row,
        project,
        _task_groups(row),
        tuple(Placement(p.task, p.node.name, tuple(p.devices), p.gpu) for p in row.placements),
    )


def record_of(
    row: Any,
    project: str,
    task_groups: tuple[TaskGroup, ...],
    placements: tuple[Placement, ...],
) -> WorkloadRecord:
    """The workload of a row's columns (an ORM row, or a plain row of a select of every
    column of `workloads`) in queue `project`, with its task groups and placements."""
    return WorkloadRecord(
        id=row.id,
        spec=spec_of(row, project, task_groups),
        status=row.status,
        reason=row.reason,
        attempts=row.attempts,
        failures=row.failures,
        dirs_by_name=row.dirs_by_name,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        pending_since=row.pending_since,
        placements=placements,
        exit_code=row.exit_code,
        cancelled_by=row.cancelled_by,
        checkpoint_at=row.checkpoint_at,
        lost_work=lost_work_of(row),
    )


def lost_work_of(row: Any) -> LostWork | None:
    """What the row's latest preemption lost, when it was recorded."""
    if row.preempted_at is None or row.lost_gpu_seconds is None or row.lost_since is None:
        return None
    return LostWork(
        row.preempted_at, row.lost_gpu_seconds, row.lost_since, bool(row.lost_since_checkpoint)
    )
