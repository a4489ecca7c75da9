"""Honest reasons in the CLI: `corral why` as deep as `corral plan` (its queues, whether
reclaim or preemption may help and why not, who holds the GPUs and whether they may be
taken), `corral logs` of a workload that has not started, and a submission that can
never fit refused with the reason."""

from __future__ import annotations

import httpx
from cli_support import Cli, make, row, wait_for


def _pending_with_reason(api: httpx.Client, name: str) -> str:
    def probe() -> str | None:
        workload = api.get(f"/workloads/{name}").json()
        assert workload["status"] == "pending", workload
        reason: str | None = workload["reason"]
        return reason

    return wait_for(probe, f"a pending reason for {name}")


def test_why_explains_reclaim_and_who_holds_the_gpus(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "why-a", "deserved": 2})
    make(api, "/queues", {"name": "why-b", "deserved": 2})
    make(api, "/nodes", {"name": "why-node", "gpus": 4, "labels": {"pool": "why"}})
    pool = ("--node-selector", "pool=why", "--export", "NONE")
    admin.ok("submit", "why-big", "-p", "why-a", "-g", "4", *pool, "--", "sleep", "60")
    wait_for(lambda: api.get("/workloads/why-big").json()["status"] == "running", "why-big to run")
    admin.ok("submit", "why-wants", "-p", "why-b", "-g", "3", *pool, "--", "true")
    reason = _pending_with_reason(api, "why-wants")

    why = api.get("/workloads/why-wants/why").json()
    assert why["needs"] == 3
    assert why["queues"] == [
        {
            "name": "why-b",
            "deserved": 2,
            "limit": None,
            "fair_share": 2,
            "allocated": 0,
            # Time-decayed fair share is off.
            "effective_weight": None,
            "weight_reason": None,
        }
    ]
    not_allowed = "why-b holds 0 of its fair share of 2 GPUs, and 3 more would exceed it"
    assert why["reclaim"] == f"not allowed: {not_allowed}"
    assert why["preempt"] == (
        "nothing to preempt: no lower-priority preemptible work of why-b runs on the nodes "
        "it may use"
    )
    [holder] = why["holders"]
    assert (holder["workload"], holder["may_take"]) == ("why-big", f"no: {not_allowed}")

    out = admin.ok("why", "why-wants")
    lines = out.splitlines()
    assert lines[0] == f"why-wants is pending: {reason}"
    assert "It needs 3 GPUs at once." in lines
    assert f"Reclaim: not allowed: {not_allowed}." in lines
    assert row(out, "why-big")[-1] == f"no: {not_allowed}"
    assert row(out, "why-b")[1:] == ["2", "-", "2", "0"]

    # Its log: nothing yet, and stderr says why.
    done = admin.run("logs", "why-wants")
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr == (
        f"why-wants has not started: it is pending ({reason}); see corral why why-wants\n"
    )


def test_why_says_how_usage_moved_the_weight(admin: Cli, api: httpx.Client) -> None:
    """With time-decayed fair share on, `corral why` gives each queue's effective
    over-quota weight and the usage it comes from."""
    make(api, "/queues", {"name": "tdw", "deserved": 0, "fair_share_half_life": "1h"})
    make(api, "/queues", {"name": "tdw-a", "parent": "tdw", "deserved": 2})
    make(api, "/queues", {"name": "tdw-b", "parent": "tdw", "deserved": 2, "fair_share_k": 2})
    make(api, "/nodes", {"name": "tdw-node", "gpus": 4, "labels": {"pool": "tdw"}})
    pool = ("--node-selector", "pool=tdw", "--export", "NONE")
    admin.ok("submit", "tdw-big", "-p", "tdw-a", "-g", "4", *pool, "--", "sleep", "60")
    wait_for(lambda: api.get("/workloads/tdw-big").json()["status"] == "running", "tdw-big")
    admin.ok("submit", "tdw-wants", "-p", "tdw-b", "-g", "3", *pool, "--", "true")
    _pending_with_reason(api, "tdw-wants")

    def weighed() -> dict[str, object] | None:
        queues = api.get("/workloads/tdw-wants/why").json()["queues"]
        found: dict[str, object] = queues[0]
        return found if found["effective_weight"] is not None else None

    queue = wait_for(weighed, "tdw-b's effective weight")
    assert queue["name"] == "tdw-b"
    reason = str(queue["weight_reason"])
    assert reason.startswith("weight 1"), reason
    assert "of the cluster's GPU-time over a 1h half-life (k = 2)" in reason
    out = admin.ok("why", "tdw-wants")
    assert "Over-quota weight of tdw-b: weight 1" in out
    assert "Over-quota weight of tdw: weight 1" in out
    listed = {q["name"]: q for q in api.get("/queues").json()}
    assert listed["tdw-a"]["weight_reason"] is not None
    assert listed["tdw-a"]["fair_share_half_life"] is None  # inherited, not its own
    # Off again and the work gone, so that the tests after this one share nothing of it.
    assert api.patch("/queues/tdw", json={"fair_share_half_life": None}).status_code == 200
    admin.ok("cancel", "tdw-big")
    admin.ok("cancel", "tdw-wants")


def test_submit_refuses_what_can_never_fit(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "nf"})
    make(api, "/nodes", {"name": "nf-node", "gpus": 4, "labels": {"pool": "nf"}})
    message = admin.fails(
        "submit", "nf-16", "-p", "nf", "-g", "16", "--node-selector", "pool=nf", "--", "true",
        code=2,
    )  # fmt: skip
    assert message == (
        "tasks[0].gpu: no node matching its node selector has 16 GPUs; the largest has 4"
    )
    assert api.get("/workloads/nf-16").status_code == 404
