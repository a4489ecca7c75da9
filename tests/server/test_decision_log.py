"""The server's log tells each scheduling decision at info level (bound where; evicted by
what, for whom and why), and not the API calls the dashboard makes."""

from __future__ import annotations

from typing import Any

import pytest
from server_support import Api, unique, wait_for

from corral.control.decision_log import where
from corral.dashboard.views import longest_waits, waited
from corral.model import Placement

sqlite_only = pytest.mark.parametrize("shared_server", ["sqlite"], indirect=True)


def _log(server: Any) -> str:
    text: str = server.log.read_text()
    return text


@sqlite_only
def test_binding_and_eviction_are_logged_and_reads_are_not(api: Api, shared_server: Any) -> None:
    project = api.queue("log", deserved=1)["name"]
    pool = unique("pool")
    node = api.node(pool, gpus=1)["name"]
    low = api.submit(project, pool, name=unique("low"))["name"]
    api.wait_status(low, "running")
    # The log names workloads by their keys, PROJECT/NAME.
    bound = f"bound {project}/{low}: 1 task on {node} (GPUs 0)"
    wait_for(lambda: bound in _log(shared_server), "the binding in the log")

    high = api.submit(project, pool, name=unique("high"), priority="inference")["name"]
    api.wait_status(high, "running")
    evicted = f"evicted {project}/{low} (tasks 0) by preempt for {project}/{high}: "
    wait_for(lambda: evicted in _log(shared_server), "the eviction in the log")
    assert f"bound {project}/{high}: 1 task on {node} (GPUs 0)" in _log(shared_server)
    # Requeued, its wait starts again from the eviction.
    requeued = api.workload(low)
    assert requeued["status"] == "pending"
    assert requeued["pending_since"] >= requeued["started_at"] > requeued["created_at"]
    assert api.workload(high)["pending_since"] is None  # running: not waiting

    # What the dashboard reads leaves no line per call.
    before = _log(shared_server)
    for path in ("/queues", "/nodes", "/workloads", "/cluster", f"/workloads/{low}/why"):
        api.admin.get(path)
    after = _log(shared_server)[len(before) :]
    assert "GET" not in after and "/api/v1" not in after, after


def test_where_a_workload_was_bound() -> None:
    assert where((Placement(0, "a", (0, 1), 2), Placement(1, "a", (2, 3), 2))) == (
        "2 tasks on a (GPUs 0,1; 2,3)"
    )
    assert where((Placement(0, "a", (0,), 0.5),)) == "1 task on a (GPUs 0 x0.5)"
    many = tuple(Placement(i, f"n{i:02}", (0,), 1) for i in range(10))
    assert where(many).endswith("n07 (GPUs 0), and 2 more nodes")


def test_a_pending_workload_waits_from_when_it_last_became_pending() -> None:
    submitted = {"status": "pending", "created_at": 100.0, "started_at": None}
    assert waited(submitted | {"pending_since": 100.0}, now=160.0) == 60.0
    requeued = submitted | {"started_at": 110.0, "pending_since": 150.0}
    assert waited(requeued, now=160.0) == 10.0
    assert waited(requeued | {"status": "running"}, now=160.0) == 10.0  # its first wait
    # Rows from before pending_since existed: from submission.
    assert waited(submitted | {"pending_since": None}, now=160.0) == 60.0
    waits = longest_waits(
        [requeued | {"name": "b"}, submitted | {"name": "a", "pending_since": 100.0}], 160.0
    )
    assert [(w["name"], w["waited"]) for w in waits] == [("a", 60.0), ("b", 10.0)]
