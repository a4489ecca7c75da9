"""Reading scenario files: every field of FORMAT.md, and a precise message for each mistake."""

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral.model import GIB, Placement, Resources, TaskGroup, Topology
from corral.scenario import (
    RunningExpectation,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

SCENARIOS = Path(__file__).parent / "scenarios"

Document = dict[str, Any]


def base() -> Document:
    """A small valid scenario that each invalid case breaks in one place."""
    return {
        "name": "base",
        "nodes": [
            {"name": "node0", "gpus": 4},
            {"name": "node1", "gpus": 2, "cpu": 8, "memory": "64GiB", "labels": {"rack": "r1"}},
        ],
        "queues": [
            {"name": "dept", "deserved": 4},
            {"name": "team-a", "parent": "dept", "deserved": 2},
            {"name": "team-b", "parent": "dept"},
        ],
        "workloads": [
            {"name": "w0", "queue": "team-a", "tasks": "1x1"},
            {"name": "w1", "queue": "team-b", "tasks": "2x1", "status": "running", "node": "node0"},
        ],
    }


def parse(document: Document) -> Scenario:
    return parse_scenario(yaml.safe_dump(document, sort_keys=False), "S.yaml")


def load_text(text: str) -> Scenario:
    return parse_scenario(text, "S.yaml")


# --- valid files ------------------------------------------------------------------------


def test_every_public_scenario_loads() -> None:
    paths = sorted(SCENARIOS.glob("*.yaml"))
    assert paths
    for path in paths:
        scenario = load_scenario(path)
        assert scenario.name == path.stem
        assert scenario.source == str(path)


def test_top_level_defaults() -> None:
    scenario = load_text("name: x\n")
    assert scenario.description == ""
    assert scenario.cycles == "until-stable"
    assert scenario.config.placement == "binpack"
    assert scenario.config.actions == ("allocate", "consolidate", "reclaim", "preempt")
    snapshot = scenario.snapshot
    assert (snapshot.nodes, snapshot.queues, snapshot.workloads) == ((), (), ())
    assert scenario.expectations is None


def test_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "my-scenario.yaml"
    path.write_text("nodes: []\n")
    assert load_scenario(path).name == "my-scenario"


def test_scheduler_and_run() -> None:
    scenario = load_text(
        "scheduler: {placement: spread, gpu_placement: spread, actions: [reclaim, allocate]}\n"
        "run: {cycles: 3}\n"
    )
    assert scenario.config.placement == "spread"
    assert scenario.config.gpu_placement == "spread"
    assert scenario.config.actions == ("reclaim", "allocate")
    assert scenario.cycles == 3


def test_nodes() -> None:
    document = base()
    document["nodes"].append(
        {
            "name": "node2",
            "gpus": 8,
            "gpu_memory": "40GiB",
            "gpu_model": "A100",
            "cpu": 0.5,
            "memory": "1TiB",
            "labels": {"rack": "r2", "zone": 3, "spot": True},
        }
    )
    node0, node1, node2 = parse(document).snapshot.nodes
    assert (node0.gpus, node0.gpu_memory, node0.gpu_model) == (4, 80 * GIB, "generic")
    assert (node0.cpu, node0.memory, node0.labels) == (64.0, 512 * GIB, {})
    assert (node1.cpu, node1.memory) == (8.0, 64 * GIB)
    assert (node2.gpus, node2.gpu_memory, node2.gpu_model) == (8, 40 * GIB, "A100")
    assert (node2.cpu, node2.memory) == (0.5, 1024 * GIB)
    assert node2.labels == {"rack": "r2", "zone": "3", "spot": "true"}


def test_queues() -> None:
    document = base()
    document["queues"] = [
        {"name": "dept", "deserved": 4, "limit": None, "over_quota_weight": 2, "priority": 120},
        {"name": "team-a", "parent": "dept", "deserved": 1.5, "limit": 3},
        {
            "name": "team-b",
            "parent": "dept",
            "deserved": {"gpu": 2, "cpu": 16, "memory": "64GiB"},
            "limit": {"gpu": 4, "cpu": None},
            "over_quota_weight": {"gpu": 3, "memory": 0},
        },
    ]
    dept, team_a, team_b = parse(document).snapshot.queues
    assert dept.parent is None
    # CPU and memory not given are not managed: unlimited, as deserved and as limit.
    assert dept.deserved == Resources(4, math.inf, math.inf)
    assert dept.limit == Resources(math.inf, math.inf, math.inf)
    assert dept.over_quota_weight == Resources(2, 2, 2)
    assert dept.priority == 120
    assert team_a.parent == "dept"
    assert team_a.deserved == Resources(1.5, math.inf, math.inf)
    assert team_a.limit == Resources(3, math.inf, math.inf)
    assert team_a.over_quota_weight == Resources(1, 1, 1)
    assert team_a.priority == 100
    assert team_b.deserved == Resources(2, 16, 64 * GIB)
    assert team_b.limit == Resources(4, math.inf, math.inf)
    assert team_b.over_quota_weight == Resources(3, 1, 0)


def test_a_limit_may_cap_a_resource_whose_deserved_is_not_set() -> None:
    document = base()
    document["queues"][1]["limit"] = {"gpu": 3, "cpu": 12}
    document["queues"][2]["deserved"] = {"cpu": 4}
    _, team_a, team_b = parse(document).snapshot.queues
    assert team_a.limit == Resources(3, 12, math.inf)
    assert team_b.deserved == Resources(0, 4, math.inf)


def test_workloads() -> None:
    document = base()
    document["workloads"] = [
        {"name": "train", "queue": "team-a", "priority": "train", "tasks": "2x1"},
        {"name": "build", "queue": "team-a", "priority": "build", "tasks": "1x0.5"},
        {"name": "custom", "queue": "team-a", "priority": 90, "preemptible": False, "tasks": "1x2"},
        {
            "name": "dist",
            "queue": "team-b",
            "priority": "inference",
            "preemptible": True,
            "tasks": [
                {"name": "master", "replicas": 1, "gpu": 1},
                {
                    "name": "worker",
                    "replicas": 3,
                    "gpu_memory": "20GiB",
                    "cpu": 8,
                    "memory": "32GiB",
                },
            ],
            "min_available": 2,
            "node_selector": {"rack": "r1", "gpu_model": ["V100M16", "V100M32"]},
            "topology": {"required": "rack"},
        },
        {"name": "soft", "queue": "team-b", "tasks": "1x0", "topology": {"preferred": "zone"}},
    ]
    train, build, custom, dist, soft = parse(document).snapshot.workloads
    assert [w.submitted for w in (train, build, custom, dist, soft)] == [0, 1, 2, 3, 4]
    assert (train.priority, train.preemptible, train.task_groups) == (
        50,
        True,
        (TaskGroup(replicas=2, gpu=1),),
    )
    assert (build.priority, build.preemptible) == (100, False)
    assert build.task_groups[0].fractional
    assert (custom.priority, custom.preemptible) == (90, False)
    assert (dist.priority, dist.preemptible, dist.min_available) == (125, True, 2)
    assert dist.task_groups == (
        TaskGroup(name="master", replicas=1, gpu=1),
        TaskGroup(name="worker", replicas=3, gpu_memory=20 * GIB, cpu=8, memory=32 * GIB),
    )
    assert dist.node_selector == {"rack": ("r1",), "gpu_model": ("V100M16", "V100M32")}
    assert dist.topology == Topology("rack", required=True)
    assert soft.topology == Topology("zone", required=False)
    assert all(not w.placements for w in (train, build, custom, dist, soft))


def test_running_whole_gpu_tasks_take_the_lowest_free_devices_in_listing_order() -> None:
    document = base()
    document["workloads"] = [
        {"name": "a", "queue": "team-a", "tasks": "1x2", "status": "running", "node": "node0"},
        {"name": "p", "queue": "team-a", "tasks": "1x1"},
        {
            "name": "b",
            "queue": "team-b",
            "tasks": "2x1",
            "status": "running",
            "nodes": ["node1", "node0"],
        },
    ]
    a, p, b = parse(document).snapshot.workloads
    assert a.placements == (Placement(0, "node0", (0, 1), 2.0),)
    assert p.placements == ()
    assert b.placements == (Placement(0, "node1", (0,), 1.0), Placement(1, "node0", (2,), 1.0))


def test_running_fractions_share_a_device_by_gpu_group() -> None:
    document = base()
    running = {"status": "running", "node": "node0", "queue": "team-a"}
    document["workloads"] = [
        {"name": "f1", "tasks": "1x0.5", "gpu_group": "G0", **running},
        {"name": "f2", "tasks": "1x0.25", **running},
        {"name": "f3", "tasks": "1x0.3", "gpu_group": "G0", **running},
        # Whole tasks take the lowest devices even when listed after the fractions.
        {"name": "whole", "tasks": "1x1", **running},
        {"name": "f4", "tasks": "2x0.1", "gpu_group": "G1", **running},
        {"name": "f5", "tasks": [{"gpu_memory": "40GiB"}], "gpu_group": "G1", **running},
    ]
    found = {w.name: w.placements for w in parse(document).snapshot.workloads}
    assert found["whole"] == (Placement(0, "node0", (0,), 1.0),)
    assert found["f1"] == (Placement(0, "node0", (1,), 0.5),)
    assert found["f2"] == (Placement(0, "node0", (2,), 0.25),)
    assert found["f3"] == (Placement(0, "node0", (1,), 0.3),)
    assert found["f4"] == (Placement(0, "node0", (3,), 0.1), Placement(1, "node0", (3,), 0.1))
    assert found["f5"] == (Placement(0, "node0", (3,), 0.5),)


def test_same_gpu_group_on_different_nodes_is_different_devices() -> None:
    document = base()
    document["workloads"] = [
        {
            "name": "f",
            "queue": "team-a",
            "tasks": "2x0.5",
            "gpu_group": "G0",
            "status": "running",
            "nodes": ["node1", "node0"],
        },
    ]
    (workload,) = parse(document).snapshot.workloads
    assert workload.placements == (
        Placement(0, "node1", (0,), 0.5),
        Placement(1, "node0", (0,), 0.5),
    )


def test_public_fractional_scenario_places_the_running_share() -> None:
    scenario = load_scenario(SCENARIOS / "S25-fractional-packing-np-quota.yaml")
    running = scenario.snapshot.workloads[0]
    assert running.placements == (Placement(0, "node0", (0,), 0.5),)


def test_elastic_running_workload_may_list_fewer_nodes() -> None:
    document = base()
    document["workloads"] = [
        {
            "name": "e",
            "queue": "team-a",
            "tasks": "3x1",
            "min_available": 1,
            "status": "running",
            "nodes": ["node1", "node1"],
        },
    ]
    (workload,) = parse(document).snapshot.workloads
    assert [p.task for p in workload.placements] == [0, 1]


def test_expectations() -> None:
    document = base()
    document["workloads"] += [
        {"name": "f1", "queue": "team-a", "tasks": "1x0.5"},
        {"name": "f2", "queue": "team-a", "tasks": "1x0.5"},
        {"name": "e", "queue": "team-a", "tasks": "3x1", "min_available": 2},
    ]
    document["expect"] = {
        "running": {
            "w1": ["node0", "node0"],
            "f1": "node0",
            "f2": "any",
            "e": ["node1", "node0"],
        },
        "pending": ["w0"],
        "evicted": ["w1"],
        "same_gpu": [["f1", "f2"]],
    }
    expectations = parse(document).expectations
    assert expectations is not None
    assert expectations.running == {
        "w1": RunningExpectation(nodes=("node0", "node0")),
        "f1": RunningExpectation(node="node0"),
        "f2": RunningExpectation(),
        "e": RunningExpectation(nodes=("node1", "node0")),
    }
    assert expectations.pending == ("w0",)
    assert expectations.evicted == ("w1",)
    assert expectations.same_gpu == (("f1", "f2"),)


def test_empty_expect_lists() -> None:
    expectations = load_text("expect:\n  running: {}\n  pending:\n").expectations
    assert expectations is not None
    assert (expectations.running, expectations.pending) == ({}, ())


def test_yaml_merge_keys_are_not_duplicates() -> None:
    text = "nodes:\n  - &n {name: node0, gpus: 2}\n  - <<: *n\n    name: node1\n"
    assert [node.name for node in load_text(text).snapshot.nodes] == ["node0", "node1"]


# --- invalid files ----------------------------------------------------------------------


def _set(path: str, value: object) -> Callable[[Document], None]:
    """A mutation that sets the field at a dotted path (`workloads.0.tasks`)."""

    def mutate(document: Document) -> None:
        *parents, last = path.split(".")
        target: Any = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return mutate


def _delete(path: str) -> Callable[[Document], None]:
    def mutate(document: Document) -> None:
        *parents, last = path.split(".")
        target: Any = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        del target[last]

    return mutate


def _append(section: str, item: object) -> Callable[[Document], None]:
    def mutate(document: Document) -> None:
        document.setdefault(section, []).append(item)

    return mutate


def _all(*mutations: Callable[[Document], None]) -> Callable[[Document], None]:
    def mutate(document: Document) -> None:
        for one in mutations:
            one(document)

    return mutate


RUNNING = {"queue": "team-a", "status": "running"}

INVALID: list[tuple[str, Callable[[Document], None], str, str]] = [
    # (id, mutation, field path, part of the problem)
    (
        "half-life-not-duration",
        _set("queues.1.fair_share_half_life", "a day"),
        "queues[1].fair_share_half_life",
        "'a day' is not a duration",
    ),
    (
        "fair-share-k-negative",
        _set("queues.1.fair_share_k", -1),
        "queues[1].fair_share_k",
        "-1 is negative",
    ),
    (
        "usage-above-one",
        _set("queues.2.usage", 1.5),
        "queues[2].usage",
        "1.5 is above 1",
    ),
    (
        "usage-not-number",
        _set("queues.2.usage", "most"),
        "queues[2].usage",
        "must be a number",
    ),
    (
        "min-runtime-not-duration",
        _set("queues.1.reclaim_min_runtime", "soon"),
        "queues[1].reclaim_min_runtime",
        "'soon' is not a duration",
    ),
    (
        "min-runtime-zero",
        _set("queues.0.preempt_min_runtime", 0),
        "queues[0].preempt_min_runtime",
        "must be more than 0 seconds",
    ),
    (
        "running-for-on-pending",
        _set("workloads.0.running_for", "5m"),
        "workloads[0].running_for",
        "only a running workload has this field",
    ),
    (
        "since-checkpoint-on-pending",
        _set("workloads.0.since_checkpoint", "5m"),
        "workloads[0].since_checkpoint",
        "only a running workload has this field",
    ),
    (
        "reserve-after-not-duration",
        _set("queues.0.reserve_after", "later"),
        "queues[0].reserve_after",
        "'later' is not a duration",
    ),
    (
        "waiting-for-on-running",
        _set("workloads.1.waiting_for", "5m"),
        "workloads[1].waiting_for",
        "only a pending workload has this field",
    ),
    (
        "max-runtime-zero",
        _set("workloads.0.max_runtime", 0),
        "workloads[0].max_runtime",
        "must be more than 0 seconds",
    ),
    (
        "expect-reserved-unknown-node",
        _set("expect", {"reserved": {"w0": ["node9"]}}),
        "expect.reserved.w0[0]",
        "node9",
    ),
    (
        "expect-reserved-and-running",
        _set("expect", {"running": {"w0": "node0"}, "reserved": {"w0": "node0"}}),
        "expect.reserved.w0",
        "also expected running",
    ),
    (
        "running-for-not-duration",
        _set("workloads.1.running_for", -3),
        "workloads[1].running_for",
        "must be more than 0 seconds",
    ),
    (
        "bad-shorthand",
        _set("workloads.0.tasks", "2xA"),
        "workloads[0].tasks",
        '"2xA" is not REPLICASxGPUS',
    ),
    (
        "zero-replicas",
        _set("workloads.0.tasks", "0x1"),
        "workloads[0].tasks",
        "REPLICAS must be at least 1",
    ),
    (
        "tasks-not-list",
        _set("workloads.0.tasks", 3),
        "workloads[0].tasks",
        "must be REPLICASxGPUS or a non-empty list",
    ),
    (
        "unknown-parent",
        _set("queues.1.parent", "dept-9"),
        "queues[1].parent",
        'unknown queue "dept-9"',
    ),
    ("self-parent", _set("queues.0.parent", "dept"), "queues[0].parent", "cycle dept -> dept"),
    ("duplicate-node", _set("nodes.1.name", "node0"), "nodes[1].name", 'duplicate node "node0"'),
    (
        "duplicate-queue",
        _set("queues.2.name", "team-a"),
        "queues[2].name",
        'duplicate queue "team-a"',
    ),
    (
        "duplicate-workload",
        _set("workloads.1.name", "w0"),
        "workloads[1].name",
        'duplicate workload "w0"',
    ),
    (
        "unknown-workload-field",
        _set("workloads.0.prioriti", "train"),
        "workloads[0].prioriti",
        'unknown field (did you mean "priority"?)',
    ),
    ("unknown-node-field", _set("nodes.0.gpu", 2), "nodes[0].gpu", "unknown field"),
    ("unknown-top-field", _set("expct", {}), "expct", 'unknown field (did you mean "expect"?)'),
    (
        "missing-queue",
        _delete("workloads.0.queue"),
        "workloads[0].queue",
        "required field is missing",
    ),
    ("negative-deserved", _set("queues.1.deserved", -1), "queues[1].deserved", "-1 is negative"),
    (
        "negative-deserved-cpu",
        _set("queues.1.deserved", {"cpu": -2}),
        "queues[1].deserved.cpu",
        "-2 is negative",
    ),
    (
        "negative-weight",
        _set("queues.1.over_quota_weight", -1),
        "queues[1].over_quota_weight",
        "-1 is negative",
    ),
    (
        "limit-below-deserved",
        _set("queues.1.limit", 1),
        "queues[1].limit",
        "gpu limit 1 is below deserved 2",
    ),
    (
        "limit-below-deserved-memory",
        _set(
            "queues.1",
            {
                "name": "team-a",
                "parent": "dept",
                "deserved": {"memory": "8GiB"},
                "limit": {"memory": "4GiB"},
            },
        ),
        "queues[1].limit",
        "memory limit 4GiB is below deserved 8GiB",
    ),
    (
        "bad-quota",
        _set("queues.1.deserved", "two"),
        "queues[1].deserved",
        'must be a number of GPUs or a map of gpu, cpu, memory, not "two"',
    ),
    (
        "non-leaf-queue",
        _set("workloads.0.queue", "dept"),
        "workloads[0].queue",
        '"dept" has child queues',
    ),
    (
        "unknown-queue",
        _set("workloads.0.queue", "team-z"),
        "workloads[0].queue",
        'unknown queue "team-z"',
    ),
    (
        "fractional-above-one",
        _set("workloads.0.tasks", "1x1.5"),
        "workloads[0].tasks",
        "1.5 GPUs is not whole",
    ),
    (
        "group-gpu-not-whole",
        _set("workloads.0.tasks", [{"gpu": 2.5}]),
        "workloads[0].tasks[0].gpu",
        "2.5 GPUs is not whole",
    ),
    (
        "gpu-and-gpu-memory",
        _set("workloads.0.tasks", [{"gpu": 0.5, "gpu_memory": "10GiB"}]),
        "workloads[0].tasks[0].gpu_memory",
        "set gpu or gpu_memory, not both",
    ),
    (
        "duplicate-task-group",
        _set("workloads.0.tasks", [{"name": "w"}, {"name": "w"}]),
        "workloads[0].tasks[1].name",
        'duplicate task group "w"',
    ),
    (
        "min-available-zero",
        _set("workloads.1.min_available", 0),
        "workloads[1].min_available",
        "0 is out of range",
    ),
    (
        "min-available-above",
        _set("workloads.1.min_available", 3),
        "workloads[1].min_available",
        "3 is out of range: the workload has 2 tasks",
    ),
    (
        "bad-priority",
        _set("workloads.0.priority", "urgent"),
        "workloads[0].priority",
        "'urgent' is not a priority class",
    ),
    (
        "bad-preemptible",
        _set("workloads.0.preemptible", "yes please"),
        "workloads[0].preemptible",
        "must be true or false",
    ),
    (
        "bad-status",
        _set("workloads.0.status", "done"),
        "workloads[0].status",
        'must be pending or running, not "done"',
    ),
    (
        "running-without-node",
        _delete("workloads.1.node"),
        "workloads[1].status",
        "a running workload needs node or nodes",
    ),
    (
        "node-and-nodes",
        _set("workloads.1.nodes", ["node0", "node0"]),
        "workloads[1].nodes",
        "give node or nodes, not both",
    ),
    (
        "pending-with-node",
        _set("workloads.0.node", "node0"),
        "workloads[0].node",
        "only a running workload has this field",
    ),
    (
        "nodes-length",
        _append("workloads", {"name": "x", "tasks": "2x1", "nodes": ["node0"], **RUNNING}),
        "workloads[2].nodes",
        "lists 1 node for 2 tasks: list one node per task",
    ),
    (
        "unknown-node",
        _set("workloads.1.node", "node7"),
        "workloads[1].node",
        'unknown node "node7"',
    ),
    (
        "unknown-node-in-list",
        _append("workloads", {"name": "x", "tasks": "2x1", "nodes": ["node0", "node9"], **RUNNING}),
        "workloads[2].nodes[1]",
        'unknown node "node9"',
    ),
    (
        "too-many-gpus",
        _append("workloads", {"name": "x", "tasks": "1x3", "node": "node0", **RUNNING}),
        "workloads[2].node",
        "node0 has only 4 GPUs",
    ),
    (
        "shared-device-over-one",
        _append(
            "workloads",
            {"name": "x", "tasks": "2x0.6", "gpu_group": "G", "node": "node1", **RUNNING},
        ),
        "workloads[2].gpu_group",
        "would put 1.2 GPUs on one device of node1",
    ),
    (
        "cpu-over-capacity",
        _append(
            "workloads",
            {"name": "x", "node": "node1", **RUNNING, "tasks": [{"replicas": 2, "cpu": 5}]},
        ),
        "workloads[2].node",
        "would use 10 CPU cores, more than its 8",
    ),
    (
        "memory-over-capacity",
        _append(
            "workloads", {"name": "x", "node": "node1", **RUNNING, "tasks": [{"memory": "65GiB"}]}
        ),
        "workloads[2].node",
        "would use 65GiB of memory, more than its 64GiB",
    ),
    (
        "gpu-group-without-fraction",
        _set("workloads.1.gpu_group", "G"),
        "workloads[1].gpu_group",
        "only fractional tasks share a device",
    ),
    (
        "memory-unit",
        _set("nodes.0.memory", "64GB"),
        "nodes[0].memory",
        '"64GB" is not a memory amount',
    ),
    (
        "memory-without-unit",
        _set("nodes.0.gpu_memory", 80),
        "nodes[0].gpu_memory",
        "80 has no unit",
    ),
    ("gpus-not-whole", _set("nodes.0.gpus", 1.5), "nodes[0].gpus", "must be a whole number"),
    ("negative-gpus", _set("nodes.0.gpus", -1), "nodes[0].gpus", "-1 is below the minimum of 0"),
    (
        "labels-not-mapping",
        _set("nodes.0.labels", ["rack"]),
        "nodes[0].labels",
        "must be a mapping",
    ),
    (
        "selector-empty-list",
        _set("workloads.0.node_selector", {"rack": []}),
        "workloads[0].node_selector.rack",
        "an empty list matches no node",
    ),
    (
        "topology-both",
        _set("workloads.0.topology", {"required": "a", "preferred": "b"}),
        "workloads[0].topology",
        "give exactly one of required",
    ),
    (
        "unknown-scheduler-key",
        _set("scheduler", {"placment": "spread"}),
        "scheduler.placment",
        'unknown field (did you mean "placement"?)',
    ),
    (
        "unknown-placement",
        _set("scheduler", {"placement": "bestfit"}),
        "scheduler.placement",
        'must be one of binpack, spread, not "bestfit"',
    ),
    (
        "unknown-action",
        _set("scheduler", {"actions": ["allocate", "backfill"]}),
        "scheduler.actions[1]",
        '"backfill" is not an action',
    ),
    (
        "cycles-zero",
        _set("run", {"cycles": 0}),
        "run.cycles",
        'must be a positive whole number or "until-stable", not the number 0',
    ),
    ("cycles-word", _set("run", {"cycles": "forever"}), "run.cycles", 'not "forever"'),
    (
        "expect-unknown-running",
        _set("expect", {"running": {"nope": "node0"}}),
        "expect.running.nope",
        'unknown workload "nope"',
    ),
    (
        "expect-unknown-pending",
        _set("expect", {"pending": ["w0", "ghost"]}),
        "expect.pending[1]",
        'unknown workload "ghost"',
    ),
    (
        "expect-unknown-evicted",
        _set("expect", {"evicted": ["ghost"]}),
        "expect.evicted[0]",
        'unknown workload "ghost"',
    ),
    (
        "expect-unknown-node",
        _set("expect", {"running": {"w0": "node5"}}),
        "expect.running.w0",
        'unknown node "node5"',
    ),
    (
        "expect-node-count",
        _set("expect", {"running": {"w1": ["node0"]}}),
        "expect.running.w1",
        "lists 1 node for 2 tasks",
    ),
    (
        "expect-elastic-below-min",
        _all(
            _append(
                "workloads", {"name": "e", "queue": "team-a", "tasks": "3x1", "min_available": 2}
            ),
            _set("expect", {"running": {"e": ["node0"]}}),
        ),
        "expect.running.e",
        "lists 1 node, but the workload runs 2 to 3 tasks",
    ),
    (
        "expect-both",
        _set("expect", {"running": {"w0": "any"}, "pending": ["w0"]}),
        "expect.pending[0]",
        '"w0" is also expected running',
    ),
    (
        "expect-unknown-key",
        _set("expect", {"runing": {}}),
        "expect.runing",
        'unknown field (did you mean "running"?)',
    ),
    (
        "same-gpu-not-running",
        _set("expect", {"same_gpu": [["w0", "w1"]]}),
        "expect.same_gpu[0][0]",
        '"w0" is not expected running',
    ),
]


@pytest.mark.parametrize(
    ("mutate", "path", "problem"),
    [case[1:] for case in INVALID],
    ids=[case[0] for case in INVALID],
)
def test_invalid_field(mutate: Callable[[Document], None], path: str, problem: str) -> None:
    document = copy.deepcopy(base())
    mutate(document)
    with pytest.raises(ScenarioError) as raised:
        parse(document)
    message = str(raised.value)
    assert message.startswith(f"S.yaml: {path}: "), message
    assert problem in message, message
    assert (raised.value.source, raised.value.path) == ("S.yaml", path)
    assert "\n" not in message


def test_queue_cycle_names_every_queue_on_it() -> None:
    document = base()
    document["queues"] += [
        {"name": "dept-a", "parent": "dept-b"},
        {"name": "dept-b", "parent": "dept-a"},
    ]
    with pytest.raises(ScenarioError) as raised:
        parse(document)
    assert str(raised.value) == "S.yaml: queues[3].parent: cycle dept-a -> dept-b -> dept-a"


def test_yaml_syntax_error_names_the_line() -> None:
    with pytest.raises(ScenarioError) as raised:
        load_text("name: x\nnodes:\n  - {name: node0, gpus: 2\nqueues: []\n")
    assert str(raised.value).startswith("S.yaml: line 4, column ")
    assert "invalid YAML" in str(raised.value)


def test_duplicate_yaml_key_names_the_line() -> None:
    with pytest.raises(ScenarioError) as raised:
        load_text("name: x\nnodes: []\nname: y\n")
    assert str(raised.value) == 'S.yaml: line 3, column 1: invalid YAML: duplicate key "name"'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "the file is empty"),
        ("- name: x\n", "a scenario must be a mapping of fields (name, nodes, ...), not a list"),
        ("just words\n", 'not "just words"'),
    ],
)
def test_file_that_is_not_a_mapping(text: str, problem: str) -> None:
    with pytest.raises(ScenarioError) as raised:
        load_text(text)
    assert str(raised.value).startswith("S.yaml: ")
    assert problem in str(raised.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    assert str(raised.value) == f"{path}: cannot read the file: No such file or directory"


def test_error_names_the_file_it_was_loaded_from(tmp_path: Path) -> None:
    path = tmp_path / "S.yaml"
    path.write_text("workloads:\n  - {name: a, queue: q, tasks: 2xA}\n")
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    assert str(raised.value) == f'{path}: workloads[0].queue: unknown queue "q"'


def test_scenario_error_is_a_value_error() -> None:
    assert issubclass(ScenarioError, ValueError)


def test_reservation_fields() -> None:
    document = base()
    document["queues"][0]["reserve_after"] = "30m"
    document["workloads"][0]["waiting_for"] = "2h"
    document["workloads"][1]["max_runtime"] = "4h"
    document["expect"] = {"running": {"w1": "node0"}, "reserved": {"w0": ["node1", "node0"]}}
    scenario = parse(document)
    dept, team_a, _ = scenario.snapshot.queues
    assert (dept.reserve_after, team_a.reserve_after) == (1800.0, None)
    w0, w1 = scenario.snapshot.workloads
    assert (w0.waiting_for, w0.max_runtime, w1.waiting_for, w1.max_runtime) == (
        7200.0,
        None,
        None,
        14400.0,
    )
    assert scenario.expectations is not None
    assert scenario.expectations.reserved == {"w0": ("node0", "node1")}


def test_min_runtimes_and_running_for() -> None:
    document = base()
    document["queues"][0]["preempt_min_runtime"] = "30m"
    document["queues"][1]["reclaim_min_runtime"] = 90
    document["workloads"][1]["running_for"] = "1h"
    document["workloads"][1]["since_checkpoint"] = "20m"
    scenario = parse(document)
    dept, team_a, team_b = scenario.snapshot.queues
    assert (dept.preempt_min_runtime, dept.reclaim_min_runtime) == (1800.0, None)
    assert (team_a.preempt_min_runtime, team_a.reclaim_min_runtime) == (None, 90.0)
    assert (team_b.preempt_min_runtime, team_b.reclaim_min_runtime) == (None, None)
    w0, w1 = scenario.snapshot.workloads
    assert (w0.running_for, w1.running_for) == (None, 3600.0)
    assert (w0.since_checkpoint, w1.since_checkpoint) == (None, 1200.0)


def test_time_decayed_fair_share_fields() -> None:
    document = base()
    document["queues"][0]["fair_share_half_life"] = "24h"
    document["queues"][1]["fair_share_k"] = 2
    document["queues"][1]["usage"] = 0.75
    document["queues"][2]["usage"] = 0
    scenario = parse(document)
    dept, team_a, team_b = scenario.snapshot.queues
    assert (dept.fair_share_half_life, dept.fair_share_k) == (86400.0, None)
    assert (team_a.fair_share_half_life, team_a.fair_share_k) == (None, 2.0)
    assert (team_b.fair_share_half_life, team_b.fair_share_k) == (None, None)
    assert scenario.snapshot.usage == {team_a.name: 0.75, team_b.name: 0.0}
