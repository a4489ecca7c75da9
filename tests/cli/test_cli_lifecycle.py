"""`corral cancel`, `update`, `history`, `list --start`, `list --array`, and `submit
--array/--after/--kill-on-invalid-dep`, run as a user would against a real server."""

from __future__ import annotations

import csv
import io
import json

import httpx
from cli_support import Cli, make, row, wait_for


def _node(api: httpx.Client, pool: str, gpus: int) -> None:
    make(api, "/nodes", {"name": f"{pool}-node", "gpus": gpus, "labels": {"pool": pool}})


def _status(api: httpx.Client, name: str) -> str:
    status: str = api.get(f"/workloads/{name}").json()["status"]
    return status


def test_array_after_cancel_and_history(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "life"})
    _node(api, "life", 4)
    out = admin.ok(
        "submit", "sweep", "-p", "life", "-g", "1", "--node-selector", "pool=life",
        "--array", "0-3%2", "--", "sleep", "600",
    )  # fmt: skip
    assert out == (
        "Submitted array sweep to life: workloads sweep-INDEX, at most 2 running at once "
        "(see corral list --array sweep).\n"
    )
    wait_for(lambda: _status(api, "sweep-1") == "running", "sweep-1 to run")
    listed = admin.ok("list", "-p", "life", "--array", "sweep")
    assert row(listed, "sweep-0")[3] == "running" and row(listed, "sweep-2")[3] == "pending"
    assert "sweep-INDEX" not in listed and "later" not in listed

    out = admin.ok(
        "submit", "later", "-p", "life", "-g", "1", "--node-selector", "pool=life",
        "--after", "sweep-0", "--after", "sweep-1:any", "--kill-on-invalid-dep", "--", "true",
    )  # fmt: skip
    assert out == "Submitted later to life (pending).\n"
    later = api.get("/workloads/later").json()
    assert later["after"] == ["sweep-0:ok", "sweep-1:any"] and later["kill_on_invalid_dep"]
    assert later["reason"] == "waiting for life/sweep-0 to succeed, life/sweep-1 to end"

    described = admin.ok("describe", "later")
    assert "after" in described and "sweep-0:ok, sweep-1:any; cancelled if one" in described
    assert "sweep (index 3), at most 2 running at once" in admin.ok("describe", "sweep-3")
    out = admin.ok("cancel", "sweep")
    assert out.splitlines() == [f"Cancelled sweep-{i}." for i in range(4)]
    # sweep-0 was cancelled, so `later` can never run: it asked to be cancelled then.
    wait_for(lambda: _status(api, "later") == "cancelled", "later to be cancelled")
    described = admin.ok("describe", "sweep-0").splitlines()
    assert any(line.split() == ["cancelled", "by", "admin"] for line in described), described
    message = admin.fails("cancel", "sweep-0", code=1)
    assert "is cancelled" in message and "delete" in message

    table = admin.ok("history", "-p", "life")
    cells = row(table, "sweep-0")
    assert cells[3] == "cancelled" and cells[4] == "1"
    assert json.loads(admin.ok("history", "-p", "life", "--state", "pending", "-o", "json")) == []
    rows = list(csv.DictReader(io.StringIO(admin.ok("history", "-p", "life", "-o", "csv"))))
    assert [r["name"] for r in rows] == [f"sweep-{i}" for i in range(4)] + ["later"]
    assert rows[0]["cancelled_by"] == "admin" and rows[0]["array_index"] == "0"
    assert rows[4]["cancelled_by"] == "scheduler" and rows[4]["started_at"] == ""
    assert admin.ok("history", "-p", "life", "--since", "1h", "--user", "nobody") == (
        "No workloads.\n"
    )


def test_update_and_estimated_start(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "upd", "deserved": 1})
    _node(api, "upd", 1)
    admin.ok(
        "submit", "holder", "-p", "upd", "-g", "1", "--node-selector", "pool=upd",
        "--max-runtime", "2h", "--non-preemptible", "--", "sleep", "600",
    )  # fmt: skip
    wait_for(lambda: _status(api, "holder") == "running", "holder to run")
    admin.ok("submit", "next", "-p", "upd", "-g", "1", "--node-selector", "pool=upd", "--", "true")
    assert admin.ok("update", "next", "--priority", "build", "--max-runtime", "1h") == (
        "Updated next (pending).\n"
    )
    changed = api.get("/workloads/next").json()
    assert (changed["priority"], changed["max_runtime"]) == (100, 3600)
    message = admin.fails("update", "holder", "--priority", "100", code=1)
    assert "running" in message
    assert "--priority" in admin.fails("update", "next", "--priority", "urgent", code=2)
    assert "give something to change" in admin.fails("update", "next", code=2)
    both = admin.fails("update", "next", "--node-pool", "a100", "--any-pool", code=2)
    assert "give --node-pool or --any-pool, not both" in both
    # (A pool named here would turn pools on for this shared server: only --any-pool.)
    assert admin.ok("update", "next", "--any-pool") == "Updated next (pending).\n"
    assert api.get("/workloads/next").json()["node_pools"] == []

    starts = admin.json("list", "-p", "upd", "--start")
    assert [s["workload"] for s in starts] == ["next"]
    holder = api.get("/workloads/holder").json()
    assert starts[0]["estimated_start"] == holder["started_at"] + 7200
    table = admin.ok("list", "-p", "upd", "--start")
    assert row(table, "next")[4] == "after running work ends (by its max runtime)"


def test_bad_array_and_after_options_name_the_option(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "badlife"})
    cases = [
        (["--array", "5-1"], "--array: '5-1': the range 5-1 ends before it starts"),
        (["--array", "0-20000"], "--array: '0-20000': an array has at most 10000 members"),
        (["--after", "x:maybe"], "--after: 'x:maybe': the condition is ok"),
        (["--kill-on-invalid-dep"], "--kill-on-invalid-dep: give --after too"),
        (["--after", "ghost"], "after: no workload 'ghost' to wait for"),
    ]
    for args, message in cases:
        said = admin.fails("submit", "-p", "badlife", *args, "--", "true", code=2)
        assert message in said, (args, said)
    assert api.get("/workloads", params={"project": "badlife"}).json() == []
