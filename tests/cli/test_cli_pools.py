"""Node pools from the command line: `corral project create|set --pool-deserved
--pool-limit`, `corral submit --node-pool`, the pool column of `corral nodes` and `corral
why` by pool.

Pools turn on for the whole cluster once a project names one, so this module has a server
of its own (the CLI fixtures start one per module)."""

from __future__ import annotations

import httpx
from cli_support import Cli, make, row, wait_for


def test_pool_quotas_are_set_merged_and_refused(admin: Cli, api: httpx.Client) -> None:
    out = admin.ok(
        "project", "create", "pa", "--deserved", "1",
        "--pool-deserved", "a100=4", "--pool-limit", "a100=8",
    )  # fmt: skip
    assert out == (
        "Created project pa: deserved 1 GPU, limit none. Pools: a100 deserved 4, limit 8.\n"
    )
    # A pool given on set changes that pool only; the others stay.
    out = admin.ok("project", "set", "pa", "--pool-deserved", "v100=2")
    assert out.endswith("Pools: a100 deserved 4, limit 8; v100 deserved 2.\n"), out
    admin.ok("project", "set", "pa", "--pool-limit", "a100=none")
    pools = api.get("/queues/pa").json()["pools"]
    assert pools["a100"]["deserved"]["gpu"] == 4 and pools["a100"]["limit"]["gpu"] is None
    assert pools["v100"]["deserved"]["gpu"] == 2

    before = api.get("/queues").json()
    for args, message in [
        (["--pool-deserved", "a100"], "--pool-deserved: 'a100' is not KEY=VALUE"),
        (["--pool-deserved", "a100=lots"], "--pool-deserved: 'lots' is not a number of GPUs"),
        (["--pool-limit", "a100=-1"], "--pool-limit: '-1' must be 0 or more"),
        (
            ["--pool-deserved", "default=1"],
            "--pool-deserved: the default pool's quota is the project's own --deserved and --limit",
        ),
    ]:
        assert admin.fails("project", "create", "pb", *args, code=2) == message
        assert admin.fails("project", "set", "pa", *args, code=2) == message
    # The server refuses a pool limit below the pool's deserved quota, naming the field.
    refused = admin.fails("project", "set", "pa", "--pool-limit", "v100=1", code=2)
    assert refused.endswith("pools.v100.limit.gpu: 1 is below deserved 2"), refused
    assert api.get("/queues").json() == before


def test_submit_to_pools_in_order_and_why(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "pq", "pools": {"a100": {"deserved": 1}}})
    make(api, "/nodes", {"name": "pq-a100", "gpus": 1, "labels": {"pool": "a100"}})
    make(api, "/nodes", {"name": "pq-v100", "gpus": 1, "labels": {"pool": "v100"}})
    nodes = admin.ok("nodes")
    assert row(nodes, "pq-a100")[8] == "a100"
    assert row(nodes, "pq-v100")[8] == "v100"

    first = ("--node-pool", "a100", "--node-pool", "v100", "--export", "NONE")
    admin.ok("submit", "pq-1", "-p", "pq", "-g", "1", *first, "--", "sleep", "60")
    admin.ok("submit", "pq-2", "-p", "pq", "-g", "1", *first, "--", "sleep", "60")

    def placed() -> dict[str, str] | None:
        where = {}
        for name in ("pq-1", "pq-2"):
            workload = api.get(f"/workloads/{name}").json()
            if workload["status"] != "running":
                return None
            where[name] = workload["placements"][0]["node"]
        return where

    # The first that fits: a100 for the older, v100 once a100 is full.
    assert wait_for(placed, "both to run") == {"pq-1": "pq-a100", "pq-2": "pq-v100"}
    assert api.get("/workloads/pq-1").json()["node_pools"] == ["a100", "v100"]
    described = admin.ok("describe", "pq-1")
    [line] = [line for line in described.splitlines() if "node pools" in line]
    assert line.split("node pools", 1)[1].strip(" │") == "a100, v100", line

    # The queues in each pool, as the latest cycle divided them.
    queues = admin.ok("queues")
    a100 = queues[queues.index("Queues in pool a100") :]
    assert row(a100, "pq")[1:] == ["1", "1", "1", "none"]
    v100 = queues[queues.index("Queues in pool v100") :]
    assert row(v100, "pq")[1:] == ["0", "1", "1", "none"]

    admin.ok("submit", "pq-3", "-p", "pq", "-g", "1", "--node-pool", "a100", "--", "true")

    def reason() -> str | None:
        text: str | None = api.get("/workloads/pq-3").json()["reason"]
        return text

    assert wait_for(reason, "a reason for pq-3").startswith("pool a100: needs 1 GPU")
    out = admin.ok("why", "pq-3")
    assert out.splitlines()[0].startswith("pq-3 is pending: pool a100: needs 1 GPU"), out
    why = api.get("/workloads/pq-3/why").json()
    # Only the a100 pool's work can make room for it.
    assert [holder["node"] for holder in why["holders"]] == ["pq-a100"]
    assert why["preempt"].startswith("pool a100: "), why["preempt"]
