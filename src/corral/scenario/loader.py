"""Read a scenario file (FORMAT.md) into a Scenario, checking every field on the way.

Every problem becomes one ScenarioError that names the file, the field path and what is
wrong, so that a typo in a long file is found without reading a traceback.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from corral.model import (
    DEFAULT_POOL,
    LimitBelowDeserved,
    Node,
    PoolQuota,
    Queue,
    QueueError,
    Resources,
    SchedulerConfig,
    Snapshot,
    TaskGroup,
    Topology,
    Workload,
    check_quota,
    check_tree,
    default_preemptible,
    format_gpus,
    format_memory,
    parse_memory,
    resolve_priority,
)
from corral.model.durations import parse_duration
from corral.model.resources import UNLIMITED
from corral.model.types import ACTIONS, GpuPlacementPolicy, PlacementPolicy
from corral.scenario.errors import FieldError, ScenarioError
from corral.scenario.running import RunningTask, assign_devices
from corral.scenario.types import (
    UNTIL_STABLE,
    Cycles,
    Expectations,
    RunningExpectation,
    Scenario,
)
from corral.scenario.yamlio import BoundedLoader, YamlLimitError, read_text
from corral.spec.limits import MAX_REPLICAS, MAX_TASK_GROUPS, gpu_problem, tasks_problem

_TOP_FIELDS = ("name", "description", "scheduler", "run", "nodes", "queues", "workloads", "expect")
_SCHEDULER_FIELDS = ("placement", "gpu_placement", "actions")
_RUN_FIELDS = ("cycles",)
_NODE_FIELDS = ("name", "gpus", "gpu_memory", "gpu_model", "cpu", "memory", "labels")
_QUEUE_FIELDS = (
    "name",
    "parent",
    "deserved",
    "limit",
    "over_quota_weight",
    "priority",
    "preempt_min_runtime",
    "reclaim_min_runtime",
    "fair_share_half_life",
    "fair_share_k",
    "usage",
    "pools",
    "reserve_after",
)
_POOL_QUOTA_FIELDS = ("deserved", "limit")
_RESOURCE_FIELDS = ("gpu", "cpu", "memory")
_WORKLOAD_FIELDS = (
    "name",
    "queue",
    "priority",
    "preemptible",
    "tasks",
    "min_available",
    "node_selector",
    "topology",
    "status",
    "node",
    "nodes",
    "gpu_group",
    "running_for",
    "since_checkpoint",
    "node_pools",
    "max_runtime",
    "waiting_for",
)
_RUNNING_FIELDS = ("node", "nodes", "gpu_group", "running_for", "since_checkpoint")
_TASK_GROUP_FIELDS = ("name", "replicas", "gpu", "gpu_memory", "cpu", "memory")
_TOPOLOGY_FIELDS = ("required", "preferred")
_EXPECT_FIELDS = ("running", "pending", "evicted", "same_gpu", "reserved")

# Typed lookups double as the list of accepted values.
_PLACEMENTS: Mapping[str, PlacementPolicy] = {"binpack": "binpack", "spread": "spread"}
_GPU_PLACEMENTS: Mapping[str, GpuPlacementPolicy] = {"pack": "pack", "spread": "spread"}
_STATUSES = ("pending", "running")
_ANY_NODE = "any"

_SHORTHAND = re.compile(r"(\d+)x(\d+(?:\.\d+)?)")
_BARE_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# More devices on a node or cycles in a run would make plan build or run that much, for
# minutes and gigabytes, from a two-line file. A workload's tasks are bounded as the API
# bounds them (corral.spec.limits).
_MOST_GPUS = 1024
_MOST_CYCLES = 1000
_MEMORY_HINT = "write memory with a binary unit: 512MiB, 64GiB, 1TiB"

# The model's defaults are the format's defaults; read them from there, not copies.
_NODE = Node("default")
_QUEUE = Queue("default")
_WORKLOAD = Workload("default", "default", ())

_Value = TypeVar("_Value")


def load_scenario(path: str | Path) -> Scenario:
    """Read and check the scenario file at `path`. Raises ScenarioError."""
    source = str(path)
    try:
        text = read_text(path)
    except YamlLimitError as error:
        raise ScenarioError(source, "", f"invalid YAML: {error.problem}") from None
    except UnicodeDecodeError:
        raise ScenarioError(source, "", "the file is not UTF-8 text") from None
    except OSError as error:
        raise ScenarioError(source, "", f"cannot read the file: {error.strerror}") from None
    return parse_scenario(text, source)


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """Read and check a scenario from YAML text; `source` names it in error messages."""
    document = _parse_yaml(text, source)
    try:
        return _read_scenario(document, source)
    except FieldError as error:
        raise ScenarioError(source, error.path, error.problem) from error


class _StrictLoader(BoundedLoader):
    """A BoundedLoader that rejects a key given twice in one mapping instead of keeping
    the last one silently."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.Node) -> dict[Any, Any]:
    assert isinstance(node, yaml.MappingNode)
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        # Merge keys (<<) legitimately repeat keys; only the mapping's own keys count.
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        if isinstance(key, Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f'duplicate key "{key}"', key_node.start_mark
                )
            seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, source: str) -> object:
    try:
        document: object = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or error.context or "unreadable"
        raise ScenarioError(source, where, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as error:
        raise ScenarioError(source, "", f"invalid YAML: {error}") from None
    return document


def _read_scenario(document: object, source: str) -> Scenario:
    if document is None:
        raise FieldError("", "the file is empty")
    if not isinstance(document, dict):
        raise FieldError(
            "", f"a scenario must be a mapping of fields (name, nodes, ...), not {_kind(document)}"
        )
    top = _fields(document, "", _TOP_FIELDS)
    name = _name(top["name"], "name") if "name" in top else Path(source).stem
    description = _text(top.get("description", ""), "description")
    config = _read_scheduler(top.get("scheduler"))
    cycles = _read_run(top.get("run"))
    nodes = _read_nodes(top.get("nodes", []))
    queues, usage = _read_queues(top.get("queues", []))
    workloads = _read_workloads(top.get("workloads", []), nodes, queues)
    expectations = _read_expect(
        top.get("expect"), {workload.name: workload for workload in workloads}, nodes
    )
    return Scenario(
        name=name,
        description=description,
        config=config,
        cycles=cycles,
        snapshot=Snapshot(tuple(nodes.values()), tuple(queues.values()), workloads, usage=usage),
        expectations=expectations,
        source=source,
    )


# --- sections -------------------------------------------------------------------------


def _read_scheduler(value: object) -> SchedulerConfig:
    if value is None:
        return SchedulerConfig()
    fields = _fields(value, "scheduler", _SCHEDULER_FIELDS)
    config = SchedulerConfig()
    if "placement" in fields:
        config = replace(
            config, placement=_choice(fields["placement"], "scheduler.placement", _PLACEMENTS)
        )
    if "gpu_placement" in fields:
        config = replace(
            config,
            gpu_placement=_choice(
                fields["gpu_placement"], "scheduler.gpu_placement", _GPU_PLACEMENTS
            ),
        )
    if "actions" in fields:
        actions: list[str] = []
        for index, item in enumerate(_list(fields["actions"], "scheduler.actions")):
            path = f"scheduler.actions[{index}]"
            if item not in ACTIONS:
                raise FieldError(path, f"{_kind(item)} is not an action ({', '.join(ACTIONS)})")
            if item in actions:
                raise FieldError(path, f'"{item}" is listed twice')
            actions.append(item)
        config = replace(config, actions=tuple(actions))
    return config


def _read_run(value: object) -> Cycles:
    if value is None:
        return UNTIL_STABLE
    fields = _fields(value, "run", _RUN_FIELDS)
    cycles = fields.get("cycles", UNTIL_STABLE)
    if cycles == UNTIL_STABLE:
        return UNTIL_STABLE
    if isinstance(cycles, int) and not isinstance(cycles, bool) and cycles >= 1:
        return _integer(cycles, "run.cycles", maximum=_MOST_CYCLES)
    raise FieldError(
        "run.cycles", f'must be a positive whole number or "{UNTIL_STABLE}", not {_kind(cycles)}'
    )


def _read_nodes(value: object) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    for index, item in enumerate(_list(value, "nodes")):
        path = f"nodes[{index}]"
        fields = _fields(item, path, _NODE_FIELDS, required=("name",))
        name = _name(fields["name"], f"{path}.name")
        _check_unique(name, nodes, f"{path}.name", "node")
        nodes[name] = Node(
            name=name,
            gpus=_given(fields, "gpus", path, _count, _NODE.gpus),
            gpu_memory=_given(fields, "gpu_memory", path, _memory, _NODE.gpu_memory),
            gpu_model=_given(fields, "gpu_model", path, _name, _NODE.gpu_model),
            cpu=_given(fields, "cpu", path, _number, _NODE.cpu),
            memory=_given(fields, "memory", path, _memory, _NODE.memory),
            labels=_given(fields, "labels", path, _read_labels, dict(_NODE.labels)),
        )
    return nodes


def _read_labels(value: object, path: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise FieldError(path, f"must be a mapping of label to value, not {_kind(value)}")
    return {_name(key, path): _label_value(item, f"{path}.{key}") for key, item in value.items()}


def _read_queues(value: object) -> tuple[dict[str, Queue], dict[str, float]]:
    """The queues by name, and the usage shares given (time-decayed fair share)."""
    queues: dict[str, Queue] = {}
    usage: dict[str, float] = {}
    for index, item in enumerate(_list(value, "queues")):
        path = f"queues[{index}]"
        fields = _fields(item, path, _QUEUE_FIELDS, required=("name",))
        name = _name(fields["name"], f"{path}.name")
        _check_unique(name, queues, f"{path}.name", "queue")
        parent = fields.get("parent")
        deserved = _quota(fields.get("deserved", 0), f"{path}.deserved", gpu_unset=0.0)
        limit = fields.get("limit")
        queue = Queue(
            name=name,
            parent=None if parent is None else _name(parent, f"{path}.parent"),
            deserved=deserved,
            limit=UNLIMITED
            if limit is None
            else _quota(limit, f"{path}.limit", gpu_unset=math.inf),
            over_quota_weight=_given(
                fields, "over_quota_weight", path, _weights, _QUEUE.over_quota_weight
            ),
            priority=_given(fields, "priority", path, _integer, _QUEUE.priority),
            preempt_min_runtime=_given(fields, "preempt_min_runtime", path, _duration, None),
            reclaim_min_runtime=_given(fields, "reclaim_min_runtime", path, _duration, None),
            fair_share_half_life=_given(fields, "fair_share_half_life", path, _duration, None),
            fair_share_k=_given(fields, "fair_share_k", path, _optional_number, None),
            pools=_given(fields, "pools", path, _read_pool_quotas, {}),
            reserve_after=_given(fields, "reserve_after", path, _duration, None),
        )
        _check_limit(queue, f"{path}.limit")
        for pool, quota in queue.pools.items():
            pooled = replace(queue, deserved=quota.deserved, limit=quota.limit)
            _check_limit(pooled, f"{path}.pools.{pool}.limit")
        queues[name] = queue
        if "usage" in fields:
            usage[name] = _share(fields["usage"], f"{path}.usage")
    _check_queue_tree(queues)
    return queues, usage


def _read_pool_quotas(value: object, path: str) -> dict[str, PoolQuota]:
    """`pools`: a queue's deserved quota and limit by node pool."""
    if not isinstance(value, dict):
        raise FieldError(path, f"must be a mapping of pool to quota, not {_kind(value)}")
    quotas: dict[str, PoolQuota] = {}
    for key, item in value.items():
        pool = _label_value(key, path)
        pool_path = f"{path}.{pool}"
        if pool == DEFAULT_POOL:
            raise FieldError(
                pool_path, "the default pool's quota is the queue's own deserved and limit"
            )
        fields = _fields(item, pool_path, _POOL_QUOTA_FIELDS)
        limit = fields.get("limit")
        quotas[pool] = PoolQuota(
            deserved=_quota(fields.get("deserved", 0), f"{pool_path}.deserved", gpu_unset=0.0),
            limit=UNLIMITED
            if limit is None
            else _quota(limit, f"{pool_path}.limit", gpu_unset=math.inf),
        )
    return quotas


def _read_node_pools(value: object, path: str) -> tuple[str, ...]:
    """`node_pools`: the pools a workload may run in, in order of preference."""
    listed = _list(value, path)
    if not listed:
        raise FieldError(path, "an empty list allows no pool; leave it out to allow any")
    pools: list[str] = []
    for index, item in enumerate(listed):
        pool = _label_value(item, f"{path}[{index}]")
        if pool in pools:
            raise FieldError(f"{path}[{index}]", f'"{pool}" is listed twice')
        pools.append(pool)
    return tuple(pools)


def _check_limit(queue: Queue, path: str) -> None:
    # Amounts were read as 0 or more: only the limit rule can fail here.
    try:
        check_quota(queue)
    except LimitBelowDeserved as error:
        show = format_memory if error.resource == "memory" else format_gpus
        raise FieldError(
            path,
            f"{error.resource} limit {show(error.limit)} is below deserved {show(error.deserved)}",
        ) from None


def _check_queue_tree(queues: Mapping[str, Queue]) -> None:
    position = {name: index for index, name in enumerate(queues)}
    try:
        check_tree(tuple(queues.values()))
    except QueueError as error:
        raise FieldError(f"queues[{position[error.queue]}].parent", error.message) from None


def _read_workloads(
    value: object, nodes: Mapping[str, Node], queues: Mapping[str, Queue]
) -> tuple[Workload, ...]:
    parents = {queue.parent for queue in queues.values() if queue.parent is not None}
    workloads: dict[str, Workload] = {}
    running: list[RunningTask] = []
    for index, item in enumerate(_list(value, "workloads")):
        workload, tasks = _read_workload(item, index, nodes, queues, parents)
        _check_unique(workload.name, workloads, f"workloads[{index}].name", "workload")
        workloads[workload.name] = workload
        running.extend(tasks)
    placements = assign_devices(nodes, running)
    return tuple(
        replace(workload, placements=placements.get(workload.name, ()))
        for workload in workloads.values()
    )


def _read_workload(
    item: object,
    index: int,
    nodes: Mapping[str, Node],
    queues: Mapping[str, Queue],
    parents: Collection[str],
) -> tuple[Workload, list[RunningTask]]:
    path = f"workloads[{index}]"
    fields = _fields(item, path, _WORKLOAD_FIELDS, required=("name", "queue", "tasks"))
    name = _name(fields["name"], f"{path}.name")
    queue = _name(fields["queue"], f"{path}.queue")
    if queue not in queues:
        raise FieldError(f"{path}.queue", f'unknown queue "{queue}"')
    if queue in parents:
        raise FieldError(
            f"{path}.queue", f'"{queue}" has child queues; workloads go to leaf queues only'
        )
    priority = _given(fields, "priority", path, _priority, _WORKLOAD.priority)
    groups = _read_tasks(fields["tasks"], f"{path}.tasks")
    task_count = sum(group.replicas for group in groups)
    problem = tasks_problem(task_count)
    if problem is not None:
        raise FieldError(f"{path}.tasks", problem)
    min_available = None
    if "min_available" in fields:
        min_available = _integer(fields["min_available"], f"{path}.min_available")
        if not 1 <= min_available <= task_count:
            raise FieldError(
                f"{path}.min_available",
                f"{min_available} is out of range: the workload has {task_count} tasks, "
                f"so min_available is 1 to {task_count}",
            )
    workload = Workload(
        name=name,
        queue=queue,
        task_groups=groups,
        priority=priority,
        preemptible=(
            _boolean(fields["preemptible"], f"{path}.preemptible")
            if "preemptible" in fields
            else default_preemptible(priority)
        ),
        min_available=min_available,
        node_selector=_read_selector(fields.get("node_selector", {}), f"{path}.node_selector"),
        topology=_read_topology(fields["topology"], f"{path}.topology")
        if "topology" in fields
        else None,
        submitted=float(index),
        running_for=_given(fields, "running_for", path, _duration, None),
        since_checkpoint=_given(fields, "since_checkpoint", path, _duration, None),
        node_pools=_given(fields, "node_pools", path, _read_node_pools, ()),
        max_runtime=_given(fields, "max_runtime", path, _duration, None),
        waiting_for=_given(fields, "waiting_for", path, _duration, None),
    )
    status = fields.get("status", "pending")
    if status not in _STATUSES:
        raise FieldError(f"{path}.status", f"must be pending or running, not {_kind(status)}")
    if status == "running" and "waiting_for" in fields:
        raise FieldError(f"{path}.waiting_for", "only a pending workload has this field")
    if status == "pending":
        for key in _RUNNING_FIELDS:
            if key in fields:
                raise FieldError(f"{path}.{key}", "only a running workload has this field")
        return workload, []
    return workload, _read_running_tasks(fields, path, workload, nodes)


def _read_running_tasks(
    fields: Mapping[str, object], path: str, workload: Workload, nodes: Mapping[str, Node]
) -> list[RunningTask]:
    if "node" in fields and "nodes" in fields:
        raise FieldError(f"{path}.nodes", "give node or nodes, not both")
    where: list[tuple[str, str]]  # (node, field that names it), one per running task
    if "node" in fields:
        node = _known_node(fields["node"], f"{path}.node", nodes)
        where = [(node, f"{path}.node")] * workload.task_count
    elif "nodes" in fields:
        listed = _list(fields["nodes"], f"{path}.nodes")
        if not workload.min_tasks <= len(listed) <= workload.task_count:
            raise FieldError(f"{path}.nodes", _node_count_problem(len(listed), workload))
        where = [
            (_known_node(item, f"{path}.nodes[{at}]", nodes), f"{path}.nodes[{at}]")
            for at, item in enumerate(listed)
        ]
    else:
        raise FieldError(f"{path}.status", "a running workload needs node or nodes")
    gpu_group = None
    if "gpu_group" in fields:
        gpu_group = _label_value(fields["gpu_group"], f"{path}.gpu_group")
        if not any(group.fractional for group in workload.task_groups):
            raise FieldError(
                f"{path}.gpu_group", "only fractional tasks share a device; this workload has none"
            )
    tasks = []
    for task, (node, field_path) in enumerate(where):
        group = workload.task_group_of(task)
        tasks.append(
            RunningTask(
                workload=workload.name,
                task=task,
                group=group,
                node=node,
                gpu_group=gpu_group if group.fractional else None,
                path=field_path,
                gpu_group_path=f"{path}.gpu_group",
            )
        )
    return tasks


def _read_tasks(value: object, path: str) -> tuple[TaskGroup, ...]:
    if isinstance(value, str):
        match = _SHORTHAND.fullmatch(value.strip())
        if match is None:
            raise FieldError(
                path, f'"{value}" is not REPLICASxGPUS (for example 2x1, or 1x0.5 for half a GPU)'
            )
        replicas = int(match[1])
        if replicas < 1:
            raise FieldError(path, f'"{value}" has no tasks: REPLICAS must be at least 1')
        if replicas > MAX_REPLICAS:
            raise FieldError(path, f'"{value}" has more than {MAX_REPLICAS} tasks')
        gpu = float(match[2])
        _check_gpu(gpu, path)
        return (TaskGroup(replicas=replicas, gpu=gpu),)
    if not isinstance(value, list) or not value:
        raise FieldError(
            path, f"must be REPLICASxGPUS or a non-empty list of task groups, not {_kind(value)}"
        )
    if len(value) > MAX_TASK_GROUPS:
        raise FieldError(path, f"at most {MAX_TASK_GROUPS} task groups, not {len(value)}")
    groups: list[TaskGroup] = []
    for index, item in enumerate(value):
        group_path = f"{path}[{index}]"
        fields = _fields(item, group_path, _TASK_GROUP_FIELDS)
        name = _name(fields.get("name", f"group{index}"), f"{group_path}.name")
        if any(group.name == name for group in groups):
            raise FieldError(f"{group_path}.name", f'duplicate task group "{name}"')
        if "gpu" in fields and "gpu_memory" in fields:
            raise FieldError(f"{group_path}.gpu_memory", "set gpu or gpu_memory, not both")
        gpu = _number(fields.get("gpu", 0), f"{group_path}.gpu")
        _check_gpu(gpu, f"{group_path}.gpu")
        gpu_memory = 0
        if "gpu_memory" in fields:
            gpu_memory = _memory(fields["gpu_memory"], f"{group_path}.gpu_memory")
            if gpu_memory == 0:
                raise FieldError(f"{group_path}.gpu_memory", "must be more than 0")
        groups.append(
            TaskGroup(
                name=name,
                replicas=_integer(
                    fields.get("replicas", 1),
                    f"{group_path}.replicas",
                    minimum=1,
                    maximum=MAX_REPLICAS,
                ),
                gpu=gpu,
                gpu_memory=gpu_memory,
                cpu=_number(fields.get("cpu", 0), f"{group_path}.cpu"),
                memory=_memory(fields.get("memory", 0), f"{group_path}.memory"),
            )
        )
    return tuple(groups)


def _check_gpu(gpu: float, path: str) -> None:
    if gpu >= 1 and gpu != int(gpu):
        raise FieldError(
            path,
            f"{format_gpus(gpu)} GPUs is not whole: a task takes a fraction of one GPU "
            "(below 1) or whole GPUs",
        )
    problem = gpu_problem(gpu)
    if problem is not None:
        raise FieldError(path, problem)


def _read_selector(value: object, path: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise FieldError(path, f"must be a mapping of label to value(s), not {_kind(value)}")
    selector: dict[str, tuple[str, ...]] = {}
    for key, item in value.items():
        label = _name(key, path)
        label_path = f"{path}.{label}"
        if isinstance(item, list):
            if not item:
                raise FieldError(label_path, "an empty list matches no node")
            selector[label] = tuple(
                _label_value(one, f"{label_path}[{at}]") for at, one in enumerate(item)
            )
        else:
            selector[label] = (_label_value(item, label_path),)
    return selector


def _read_topology(value: object, path: str) -> Topology:
    fields = _fields(value, path, _TOPOLOGY_FIELDS)
    if len(fields) != 1:
        raise FieldError(path, "give exactly one of required: LABEL or preferred: LABEL")
    ((kind, label),) = fields.items()
    return Topology(key=_name(label, f"{path}.{kind}"), required=kind == "required")


def _read_expect(
    value: object, workloads: Mapping[str, Workload], nodes: Mapping[str, Node]
) -> Expectations | None:
    if value is None:
        return None
    fields = _fields(value, "expect", _EXPECT_FIELDS)
    targets = fields.get("running")
    if targets is None:
        targets = {}
    if not isinstance(targets, dict):
        raise FieldError(
            "expect.running", f"must be a mapping of workload to node(s), not {_kind(targets)}"
        )
    running: dict[str, RunningExpectation] = {}
    for key, target in targets.items():
        path = f"expect.running.{key}"
        workload = _known_workload(key, path, workloads)
        running[workload.name] = _running_expectation(target, path, workload, nodes)
    pending = _workload_names(fields.get("pending"), "expect.pending", workloads)
    for index, name in enumerate(pending):
        if name in running:
            raise FieldError(f"expect.pending[{index}]", f'"{name}" is also expected running')
    evicted = _workload_names(fields.get("evicted"), "expect.evicted", workloads)
    same_gpu: list[tuple[str, ...]] = []
    for index, item in enumerate(_optional_list(fields.get("same_gpu"), "expect.same_gpu")):
        path = f"expect.same_gpu[{index}]"
        names = _workload_names(item, path, workloads)
        if len(names) < 2:
            raise FieldError(path, "name at least two workloads that share a device")
        for at, name in enumerate(names):
            if name not in running:
                raise FieldError(f"{path}[{at}]", f'"{name}" is not expected running')
            if not all(group.fractional for group in workloads[name].task_groups):
                raise FieldError(f"{path}[{at}]", f'"{name}" does not ask for a GPU fraction')
        same_gpu.append(names)
    reserved = _read_reserved(fields.get("reserved"), running, workloads, nodes)
    return Expectations(
        running=running,
        pending=pending,
        evicted=evicted,
        same_gpu=tuple(same_gpu),
        reserved=reserved,
    )


def _read_reserved(
    value: object,
    running: Mapping[str, RunningExpectation],
    workloads: Mapping[str, Workload],
    nodes: Mapping[str, Node],
) -> dict[str, tuple[str, ...]]:
    """`expect.reserved`: pending workload -> the nodes reserved for it (a list)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(
            "expect.reserved", f"must be a mapping of workload to nodes, not {_kind(value)}"
        )
    reserved: dict[str, tuple[str, ...]] = {}
    for key, target in value.items():
        path = f"expect.reserved.{key}"
        workload = _known_workload(key, path, workloads)
        if workload.name in running:
            raise FieldError(path, f'"{workload.name}" is also expected running')
        listed = [target] if isinstance(target, str) else _list(target, path)
        reserved[workload.name] = tuple(
            sorted(_known_node(item, f"{path}[{at}]", nodes) for at, item in enumerate(listed))
        )
    return reserved


def _running_expectation(
    target: object, path: str, workload: Workload, nodes: Mapping[str, Node]
) -> RunningExpectation:
    if target == _ANY_NODE:
        return RunningExpectation()
    if isinstance(target, str):
        return RunningExpectation(node=_known_node(target, path, nodes))
    if isinstance(target, list):
        listed = tuple(_known_node(item, f"{path}[{at}]", nodes) for at, item in enumerate(target))
        if not workload.min_tasks <= len(listed) <= workload.task_count:
            raise FieldError(path, _node_count_problem(len(listed), workload))
        return RunningExpectation(nodes=listed)
    raise FieldError(
        path, f'must be a node, a list of nodes (one per task) or "any", not {_kind(target)}'
    )


def _node_count_problem(count: int, workload: Workload) -> str:
    listed = "1 node" if count == 1 else f"{count} nodes"
    if workload.elastic:
        return (
            f"lists {listed}, but the workload runs {workload.min_tasks} to "
            f"{workload.task_count} tasks: list one node per running task"
        )
    return f"lists {listed} for {workload.task_count} tasks: list one node per task"


# --- values ---------------------------------------------------------------------------


def _kind(value: object) -> str:
    """How a value reads in a message: `"2xA"`, `the number 3`, `a list`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _fields(
    value: object, path: str, allowed: Sequence[str], required: Sequence[str] = ()
) -> dict[str, object]:
    """The mapping at `path`, after checking that it has only known and all required keys."""
    if not isinstance(value, dict):
        raise FieldError(path, f"must be a mapping, not {_kind(value)}")
    fields: dict[str, object] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise FieldError(path, f"{_kind(key)} is not a field name")
        key_path = f"{path}.{key}" if path else key
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise FieldError(key_path, f"unknown field{hint}")
        fields[key] = item
    for key in required:
        if key not in fields:
            raise FieldError(f"{path}.{key}" if path else key, "required field is missing")
    return fields


def _list(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        raise FieldError(path, f"must be a list, not {_kind(value)}")
    return value


def _optional_list(value: object, path: str) -> list[object]:
    """A list that may be left empty (`pending:` with nothing after it reads as null)."""
    return [] if value is None else _list(value, path)


def _name(value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise FieldError(path, f"must be a non-empty string, not {_kind(value)}")
    return value


def _text(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise FieldError(path, f"must be text, not {_kind(value)}")
    return value


def _label_value(value: object, path: str) -> str:
    """Labels are strings; YAML turns `rack: 1` or `spot: true` into numbers and booleans."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str | int | float):
        return str(value)
    raise FieldError(path, f"must be a string, not {_kind(value)}")


def _boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(path, f"must be true or false, not {_kind(value)}")
    return value


def _given(
    fields: Mapping[str, object],
    key: str,
    path: str,
    read: Callable[[object, str], _Value],
    default: _Value,
) -> _Value:
    """The field `key` of the mapping at `path`, read and checked, or `default` if absent."""
    return read(fields[key], f"{path}.{key}") if key in fields else default


def _duration(value: object, path: str) -> float | None:
    """Seconds from 90, "90s", "10m", "4h" (typed to allow a None default in `_given`)."""
    try:
        return parse_duration(value)
    except ValueError as error:
        raise FieldError(path, str(error)) from None


def _optional_number(value: object, path: str) -> float | None:
    """A non-negative finite amount (typed to allow a None default in `_given`)."""
    return _number(value, path)


def _share(value: object, path: str) -> float:
    """A share from 0 to 1."""
    share = _number(value, path)
    if share > 1:
        raise FieldError(path, f"{share:g} is above 1 (a share of the cluster, 0 to 1)")
    return share


def _count(value: object, path: str) -> int:
    return _integer(value, path, minimum=0, maximum=_MOST_GPUS)


def _integer(
    value: object, path: str, minimum: int | None = None, maximum: int | None = None
) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(path, f"must be a whole number, not {_kind(value)}")
    if minimum is not None and value < minimum:
        raise FieldError(path, f"{value} is below the minimum of {minimum}")
    if maximum is not None and value > maximum:
        raise FieldError(path, f"{value} is above the maximum of {maximum}")
    return value


def _number(value: object, path: str) -> float:
    """A non-negative finite amount."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise FieldError(path, f"must be a number, not {_kind(value)}")
    if not math.isfinite(value):
        raise FieldError(path, f"must be a finite number, not {value}")
    if value < 0:
        raise FieldError(path, f"{value} is negative")
    return float(value)


def _memory(value: object, path: str) -> int:
    """Bytes, from a string with a binary unit; a bare 0 is accepted, other bare numbers
    are refused because they are almost always a forgotten unit."""
    if isinstance(value, str):
        if _BARE_NUMBER.fullmatch(value.strip()):
            raise FieldError(path, f'"{value}" has no unit ({_MEMORY_HINT})')
        try:
            return parse_memory(value)
        except ValueError:
            raise FieldError(path, f'"{value}" is not a memory amount ({_MEMORY_HINT})') from None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value == 0:
            return 0
        raise FieldError(path, f"{value} has no unit ({_MEMORY_HINT})")
    raise FieldError(path, f"must be a memory amount such as 64GiB, not {_kind(value)}")


def _quota(value: object, path: str, *, gpu_unset: float) -> Resources:
    """`deserved` or `limit`: a number of GPUs, or a map of gpu, cpu and memory.

    A GPU amount not given is `gpu_unset` (0 deserved, or no limit). CPU and memory not
    given are not managed: unlimited (math.inf), both as deserved and as limit, so a
    queue that sets GPUs only is never held back by its CPU or memory use. Inside a map,
    null means unlimited wherever leaving the key out would.
    """
    if isinstance(value, dict):
        fields = _fields(value, path, _RESOURCE_FIELDS)

        def amount(key: str, unset: float, read: Callable[[object, str], float]) -> float:
            if key not in fields or (fields[key] is None and math.isinf(unset)):
                return unset
            return read(fields[key], f"{path}.{key}")

        return Resources(
            amount("gpu", gpu_unset, _number),
            amount("cpu", math.inf, _number),
            amount("memory", math.inf, lambda item, at: float(_memory(item, at))),
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Resources(_number(value, path), math.inf, math.inf)
    raise FieldError(
        path, f"must be a number of GPUs or a map of gpu, cpu, memory, not {_kind(value)}"
    )


def _weights(value: object, path: str) -> Resources:
    """A plain weight applies to every resource; a map sets them one by one."""
    if isinstance(value, dict):
        fields = _fields(value, path, _RESOURCE_FIELDS)
        gpu, cpu, memory = (
            _given(fields, key, path, _number, _QUEUE.over_quota_weight.get(key))
            for key in _RESOURCE_FIELDS
        )
        return Resources(gpu, cpu, memory)
    weight = _number(value, path)
    return Resources(weight, weight, weight)


def _priority(value: object, path: str) -> int:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise FieldError(path, f"must be a priority class or a whole number, not {_kind(value)}")
    try:
        return resolve_priority(value)
    except ValueError as error:
        raise FieldError(path, str(error)) from None


def _choice(value: object, path: str, choices: Mapping[str, _Value]) -> _Value:
    if isinstance(value, str) and value in choices:
        return choices[value]
    raise FieldError(path, f"must be one of {', '.join(choices)}, not {_kind(value)}")


def _check_unique(name: str, seen: Mapping[str, object], path: str, what: str) -> None:
    if name in seen:
        raise FieldError(path, f'duplicate {what} "{name}"')


def _known_node(value: object, path: str, nodes: Mapping[str, Node]) -> str:
    name = _name(value, path)
    if name not in nodes:
        raise FieldError(path, f'unknown node "{name}"')
    return name


def _known_workload(value: object, path: str, workloads: Mapping[str, Workload]) -> Workload:
    name = _name(value, path)
    if name not in workloads:
        raise FieldError(path, f'unknown workload "{name}"')
    return workloads[name]


def _workload_names(value: object, path: str, workloads: Mapping[str, Workload]) -> tuple[str, ...]:
    return tuple(
        _known_workload(item, f"{path}[{at}]", workloads).name
        for at, item in enumerate(_optional_list(value, path))
    )
