"""The cluster as admins shape it: `corral project ...`, `corral queues`, `corral nodes` and
`corral node ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_support import Cli, make, row, wait_for

# Minutes of work: started before the other modules (tests/conftest.py).
pytestmark = pytest.mark.long

GIB = 1 << 30


def test_a_department_tree_with_every_quota(admin: Cli, api: httpx.Client) -> None:
    out = admin.ok("project", "create", "tree", "--deserved", "4")
    assert out == "Created project tree: deserved 4 GPUs, limit none.\n"
    admin.ok(
        "project", "create", "tree-vision", "--parent", "tree",
        "--deserved", "2", "--deserved-cpu", "16", "--deserved-memory", "64GiB",
        "--limit", "6", "--limit-cpu", "32", "--limit-memory", "128GiB",
        "--over-quota-weight", "2", "--priority", "200",
    )  # fmt: skip
    admin.ok("project", "create", "tree-nlp", "--parent", "tree", "--deserved", "0.5")
    vision = api.get("/queues/tree-vision").json()
    assert vision["parent"] == "tree"
    assert vision["deserved"] == {"gpu": 2, "cpu": 16, "memory": 64 * GIB}
    assert vision["limit"] == {"gpu": 6, "cpu": 32, "memory": 128 * GIB}
    assert vision["over_quota_weight"]["gpu"] == 2
    assert vision["priority"] == 200
    assert api.get("/queues/tree").json()["department"] is True

    listed = admin.ok("project", "list")
    tree = [line for line in listed.splitlines() if "tree" in line]
    assert "tree (department)" in tree[0]
    assert "├── tree-nlp" in tree[1]
    assert "└── tree-vision" in tree[2]
    assert row(listed, "└── tree-vision")[1:] == [
        "2 GPUs, 16 CPUs, 64GiB",
        "6 GPUs, 32 CPUs, 128GiB",
        "2",
        "200",
        "-",
    ]
    assert admin.json("project", "list") == api.get("/queues").json()


def test_set_changes_only_what_it_is_given(admin: Cli, api: httpx.Client) -> None:
    admin.ok(
        "project", "create", "setp", "--deserved", "2", "--deserved-cpu", "8",
        "--limit", "4", "--limit-memory", "64GiB",
    )  # fmt: skip
    # The API replaces a quota whole; the CLI keeps the parts not named.
    admin.ok("project", "set", "setp", "--limit-cpu", "16", "--deserved", "3")
    queue = api.get("/queues/setp").json()
    assert queue["limit"] == {"gpu": 4, "cpu": 16, "memory": 64 * GIB}
    assert queue["deserved"] == {"gpu": 3, "cpu": 8, "memory": None}
    out = admin.ok(
        "project", "set", "setp", "--limit", "none", "--deserved-cpu", "none",
        "--priority", "150", "--over-quota-weight", "3",
    )  # fmt: skip
    assert out == (
        "Updated setp: deserved 3 GPUs, limit 16 CPUs, 64GiB, over-quota weight 3, priority 150.\n"
    )
    queue = api.get("/queues/setp").json()
    assert queue["limit"] == {"gpu": None, "cpu": 16, "memory": 64 * GIB}
    assert queue["deserved"] == {"gpu": 3, "cpu": None, "memory": None}
    assert (queue["priority"], queue["over_quota_weight"]["gpu"]) == (150, 3)


def test_rules_per_workload_class_set_and_changed_one_class_at_a_time(
    admin: Cli, api: httpx.Client
) -> None:
    out = admin.ok(
        "project", "create", "ruled", "--deserved", "2",
        "--idle-timeout", "interactive=30m", "--max-runtime", "train=7d",
        "--idle-timeout", "train=2h",
    )  # fmt: skip
    assert out == (
        "Created project ruled: deserved 2 GPUs, limit none. "
        "Rules: build: idle 30m; train: idle 2h, max runtime 7d.\n"
    )
    assert api.get("/queues/ruled").json()["rules"] == {
        "build": {"idle_timeout": 1800, "max_runtime": None},
        "train": {"idle_timeout": 7200, "max_runtime": 604800},
    }
    # The API replaces the rules whole; the CLI keeps the classes and limits not named.
    admin.ok(
        "project", "set", "ruled", "--max-runtime", "inference=1d", "--idle-timeout", "train=none"
    )
    assert api.get("/queues/ruled").json()["rules"] == {
        "build": {"idle_timeout": 1800, "max_runtime": None},
        "inference": {"idle_timeout": None, "max_runtime": 86400},
        "train": {"idle_timeout": None, "max_runtime": 604800},
    }
    out = admin.ok(
        "project", "set", "ruled", "--idle-timeout", "build=none", "--max-runtime", "train=none"
    )
    assert out == (
        "Updated ruled: deserved 2 GPUs, limit none, over-quota weight 1, priority 100. "
        "Rules: inference: max runtime 1d.\n"
    )
    assert row(admin.ok("project", "list"), "ruled")[-1] == "inference: max runtime 1d"
    admin.ok("project", "set", "ruled", "--max-runtime", "inference=none")
    assert api.get("/queues/ruled").json()["rules"] == {}
    assert row(admin.ok("project", "list"), "ruled")[-1] == "-"


def test_invalid_rule_options_name_the_option_and_change_nothing(
    admin: Cli, api: httpx.Client
) -> None:
    make(api, "/queues", {"name": "rbad", "rules": {"train": {"max_runtime": 3600}}})

    def seen() -> list[dict[str, Any]] | None:
        # The listing's shares and allocations are the scheduler's: once a cycle saw rbad.
        listed: list[dict[str, Any]] = api.get("/queues").json()
        return listed if all(queue["fair_share"] for queue in listed) else None

    before = wait_for(seen, "a cycle that sees rbad")
    for args, message in [
        (["--idle-timeout", "interactive"], "--idle-timeout: 'interactive' is not CLASS=DURATION"),
        (
            ["--idle-timeout", "notebook=30m"],
            "--idle-timeout: 'notebook' is not a workload class (train, build-preemptible, "
            "build, inference, interactive, interactive-preemptible)",
        ),
        (
            ["--max-runtime", "train=soon"],
            "--max-runtime: 'soon' is not a duration (for example 90, 30m, 4h, 7d)",
        ),
        (["--max-runtime", "train=0"], "--max-runtime: '0' must be more than 0 seconds"),
        (
            ["--idle-timeout", "build=1h", "--idle-timeout", "interactive=2h"],
            "--idle-timeout: the build class is given twice",
        ),
    ]:
        assert admin.fails("project", "create", "rbad2", *args, code=2) == message
        assert admin.fails("project", "set", "rbad", *args, code=2) == message
    assert api.get("/queues").json() == before


def test_reserve_after_set_shown_and_inherited_again(admin: Cli, api: httpx.Client) -> None:
    out = admin.ok("project", "create", "bfl", "--reserve-after", "30m")
    assert out == "Created project bfl: deserved 0 GPUs, limit none. Reserves after 30m.\n"
    admin.ok("project", "set", "bfl", "--reserve-after", "inherit")
    assert api.get("/queues/bfl").json()["reserve_after"] is None
    before = api.get("/queues").json()
    message = "--reserve-after: 'soon' is not a duration (for example 90, 30m, 4h, 7d)"
    assert admin.fails("project", "create", "bfl2", "--reserve-after", "soon", code=2) == message
    assert admin.fails("project", "set", "bfl", "--reserve-after", "soon", code=2) == message
    assert api.get("/queues").json() == before


def test_min_runtimes_set_shown_and_inherited_again(admin: Cli, api: httpx.Client) -> None:
    out = admin.ok("project", "create", "mrt", "--reclaim-min-runtime", "10m")
    assert out == "Created project mrt: deserved 0 GPUs, limit none. Reclaim min-runtime 10m.\n"
    out = admin.ok("project", "set", "mrt", "--preempt-min-runtime", "90")
    assert out == (
        "Updated mrt: deserved 0 GPUs, limit none, over-quota weight 1, priority 100. "
        "Preempt min-runtime 1m30s; reclaim min-runtime 10m.\n"
    )
    admin.ok("project", "set", "mrt", "--reclaim-min-runtime", "inherit")
    queue = api.get("/queues/mrt").json()
    assert (queue["preempt_min_runtime"], queue["reclaim_min_runtime"]) == (90, None)
    before = api.get("/queues").json()
    for args, message in [
        (
            ["--reclaim-min-runtime", "soon"],
            "--reclaim-min-runtime: 'soon' is not a duration (for example 90, 30m, 4h, 7d)",
        ),
        (["--preempt-min-runtime", "0"], "--preempt-min-runtime: '0' must be more than 0 seconds"),
    ]:
        assert admin.fails("project", "create", "mrt2", *args, code=2) == message
        assert admin.fails("project", "set", "mrt", *args, code=2) == message
    assert api.get("/queues").json() == before


def test_delete_a_project_then_its_department(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "deld"})
    make(api, "/queues", {"name": "deld-p", "parent": "deld"})
    assert admin.fails("project", "delete", "deld", code=1) == (
        "queue 'deld' has child queues; delete them first"
    )
    assert admin.ok("project", "delete", "deld-p") == "Deleted deld-p.\n"
    admin.ok("project", "delete", "deld")
    assert api.get("/queues/deld").status_code == 404


def test_invalid_settings_name_the_option_or_field(admin: Cli, api: httpx.Client) -> None:
    before = api.get("/queues").json()
    for args, message in [
        (["--deserved", "abc"], "--deserved: 'abc' is not a number of GPUs"),
        (["--deserved", "-1"], "--deserved: '-1' must be 0 or more"),
        (["--limit-memory", "lots"], "--limit-memory: 'lots' is not a memory amount"),
        (["--parent", "no-such-dept"], "parent: unknown queue 'no-such-dept'"),
        (["--priority", "2000000"], "priority: Input should be less than or equal to 1000000"),
    ]:
        assert admin.fails("project", "create", "bad", *args, code=2).startswith(message)
    assert admin.fails("project", "create", "Bad_Name", code=2).startswith(
        "name: String should match pattern"
    )
    assert api.get("/queues").json() == before
    make(api, "/queues", {"name": "dup"})
    assert admin.fails("project", "create", "dup", code=1) == "queue 'dup' already exists"
    assert admin.fails("project", "set", "dup", code=2) == (
        "give at least one setting to change (see --help)"
    )
    assert admin.fails("project", "set", "nope", "--limit", "1", code=1) == (
        "queue 'nope' not found"
    )


def test_queues_show_deserved_fair_share_allocated_pending_and_limit(
    admin: Cli, api: httpx.Client
) -> None:
    make(api, "/queues", {"name": "qd", "deserved": 3})
    make(api, "/queues", {"name": "qd-a", "parent": "qd", "deserved": 1, "limit": 3})
    make(api, "/nodes", {"name": "qd-node", "gpus": 4, "labels": {"pool": "qd"}})
    for name in ("qd-run", "qd-wait"):
        admin.ok(
            "submit", name, "-p", "qd-a", "-g", "2", "--node-selector", "pool=qd", "--", "true"
        )
    queue: dict[str, Any] = wait_for(
        lambda: _counted(api.get("/queues/qd-a").json()), "a cycle to count qd-a's work"
    )
    out = admin.ok("queues")
    fair_share = queue["fair_share"]["gpu"]
    assert row(out, "└── qd-a")[1:] == ["1", f"{fair_share:g}", "2", "2", "3"]
    assert row(out, "qd (department)")[1] == "3"
    assert admin.json("queues") == api.get("/queues").json()


def _counted(queue: dict[str, Any]) -> dict[str, Any] | None:
    """The queue once a cycle has counted one workload running and one pending."""
    allocated = queue["allocated"]
    if allocated and allocated["gpu"] == 2 and queue["pending_gpu"] == 2:
        return queue
    return None


def test_nodes_show_their_devices_and_what_runs_on_each(admin: Cli, api: httpx.Client) -> None:
    out = admin.ok(
        "node", "register", "nd-1", "--gpus", "2", "--gpu-model", "A100",
        "--gpu-memory", "40GiB", "--cpu", "32", "--memory", "256GiB",
        "--label", "pool=nd", "--label", "rack=r9",
    )  # fmt: skip
    assert out == "Registered nd-1: 2 × A100 (40GiB).\n"
    node = api.get("/nodes/nd-1").json()
    assert (node["gpus"], node["gpu_model"], node["gpu_memory"]) == (2, "A100", 40 * GIB)
    assert (node["cpu"], node["memory"]) == (32, 256 * GIB)
    assert node["labels"] == {"pool": "nd", "rack": "r9"}
    make(api, "/queues", {"name": "nd"})
    admin.ok("submit", "nd-half", "-p", "nd", "-g", "0.5", "--node-selector", "pool=nd", "--", "x")
    wait_for(lambda: api.get("/nodes/nd-1").json()["tasks"], "nd-half on nd-1")
    first, second = _lines_of_row(admin.ok("nodes"), "nd-1")
    assert first[1:7] == ["ready", "0.5/2", "A100 (40GiB)", "32", "256GiB", "pool=nd"]
    assert second[6] == "rack=r9"
    # The fraction goes to one device; the other is free.
    assert {first[7], second[7]} in (
        {"0: nd-half/0 (0.5)", "1: free"},
        {"0: free", "1: nd-half/0 (0.5)"},
    )
    assert admin.json("nodes") == api.get("/nodes").json()


def test_cordon_uncordon_and_remove(admin: Cli, api: httpx.Client) -> None:
    make(api, "/nodes", {"name": "nc-1", "gpus": 1, "labels": {"pool": "nc"}})
    assert admin.ok("node", "cordon", "nc-1").startswith("Cordoned nc-1")
    assert api.get("/nodes/nc-1").json()["schedulable"] is False
    assert row(admin.ok("nodes"), "nc-1")[1] == "ready, cordoned"
    admin.ok("node", "uncordon", "nc-1")
    assert api.get("/nodes/nc-1").json()["schedulable"] is True
    assert admin.ok("node", "remove", "nc-1") == "Removed nc-1.\n"
    assert api.get("/nodes/nc-1").status_code == 404


def test_node_errors(admin: Cli, api: httpx.Client, server: Any, tmp_path: Path) -> None:
    assert admin.fails("node", "register", "ne", "--label", "rack", code=2) == (
        "--label: 'rack' is not KEY=VALUE"
    )
    assert admin.fails("node", "register", "ne", "--gpu-memory", "big", code=2).startswith(
        "--gpu-memory: 'big' is not a memory amount"
    )
    make(api, "/nodes", {"name": "ne"})
    assert admin.fails("node", "register", "ne", code=1) == "node 'ne' already exists"
    make(api, "/queues", {"name": "ne-p"})
    token = make(api, "/users", {"name": "ne-m", "project": "ne-p"})["token"]
    member = Cli(tmp_path, server.url, token)
    assert member.fails("node", "cordon", "ne", code=1) == ("ne-m is a member; this needs an admin")


def _lines_of_row(output: str, first_cell: str) -> list[list[str]]:
    """The cells of each line of a table row that spans several lines."""
    found: list[list[str]] = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if found and cells[0] == "" and len(cells) == len(found[0]):
            found.append(cells)
        elif found:
            break
        elif cells[0] == first_cell:
            found.append(cells)
    assert found, f"no row {first_cell!r} in:\n{output}"
    return found


def test_time_decayed_fair_share_set_shown_and_inherited_again(
    admin: Cli, api: httpx.Client
) -> None:
    out = admin.ok("project", "create", "tds", "--fair-share-half-life", "24h")
    assert out == (
        "Created project tds: deserved 0 GPUs, limit none. Time-decayed fair share: half-life 1d.\n"
    )
    out = admin.ok("project", "set", "tds", "--fair-share-k", "2")
    assert out == (
        "Updated tds: deserved 0 GPUs, limit none, over-quota weight 1, priority 100. "
        "Time-decayed fair share: half-life 1d, k 2.\n"
    )
    admin.ok("project", "set", "tds", "--fair-share-half-life", "inherit")
    queue = api.get("/queues/tds").json()
    assert (queue["fair_share_half_life"], queue["fair_share_k"]) == (None, 2)
    before = api.get("/queues").json()
    for args, message in [
        (
            ["--fair-share-half-life", "soon"],
            "--fair-share-half-life: 'soon' is not a duration (for example 90, 30m, 4h, 7d)",
        ),
        (["--fair-share-k", "lots"], "--fair-share-k: 'lots' is not a usage factor"),
        (["--fair-share-k", "-1"], "--fair-share-k: '-1' must be 0 or more"),
    ]:
        assert admin.fails("project", "create", "tds2", *args, code=2) == message
        assert admin.fails("project", "set", "tds", *args, code=2) == message
    assert api.get("/queues").json() == before
