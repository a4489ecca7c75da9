"""Arrays, dependencies and cancel on a real `corral up`: real task processes, the array's
running limit seen by the tasks themselves, a dependency chain run in order, a failed
dependency that blocks or cancels, and a cancelled workload kept in history."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import PYTHON, CorralUp, Servers, running, wait_until

# A member of an array: it marks itself running in a shared directory, counts the marks
# (itself included), holds its GPU a while so that members would overlap if nothing held
# them back, and removes its mark before it ends.
MEMBER = """
import os, sys, time
shared = sys.argv[1]
index = os.environ["CORRAL_ARRAY_INDEX"]
mark = os.path.join(shared, "running-" + index)
open(mark, "w").close()
print("index", index, "of", os.environ["CORRAL_ARRAY_NAME"], flush=True)
print("running together:", len([f for f in os.listdir(shared) if f.startswith("running-")]),
      flush=True)
time.sleep(1.5)
print("still together:", len([f for f in os.listdir(shared) if f.startswith("running-")]),
      flush=True)
os.remove(mark)
"""


@pytest.fixture(scope="module")
def up(module_corral_up: Servers) -> Iterator[CorralUp]:
    yield module_corral_up(4, {"team": 4})


@pytest.fixture
def shared() -> Iterator[Path]:
    # Tasks may run as another account: a directory every account can write.
    folder = Path(tempfile.mkdtemp(prefix="corral-array-"))
    os.chmod(folder, 0o1777)
    yield folder
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()


def test_an_array_of_6_runs_at_most_2_at_once_and_every_index_succeeds(
    up: CorralUp, shared: Path
) -> None:
    first = up.submit("sweep", "team", [PYTHON, "-c", MEMBER, str(shared)], gpu=1, array="0-5%2")
    assert first["name"] == "sweep-0"
    for index in range(6):
        done = up.wait_status(f"sweep-{index}", timeout=120)
        assert done["status"] == "succeeded", done
    counts = []
    for index in range(6):
        log = up.log_text(f"sweep-{index}")
        assert f"index {index} of sweep\n" in log, log
        counts += [int(line.rsplit(":", 1)[1]) for line in log.splitlines() if "together:" in line]
    # 4 GPUs were free throughout: only the limit kept the members to 2 at once.
    assert len(counts) == 12 and max(counts) <= 2, counts
    assert 2 in counts, counts
    history = up.get("/history", project="team", state="succeeded")
    rows = {row["name"]: row for row in history}
    for index in range(6):
        row = rows[f"sweep-{index}"]
        assert (row["array"], row["array_index"], row["exit_code"]) == ("sweep", index, 0)
        assert row["gpu_hours"] > 0 and row["attempts"] == 1


def test_a_dependency_chain_runs_in_order(up: CorralUp, shared: Path) -> None:
    order = shared / "order"
    step = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
    up.submit("chain-a", "team", [PYTHON, "-c", step, str(order), "a"], gpu=1)
    up.submit("chain-b", "team", [PYTHON, "-c", step, str(order), "b"], gpu=1, after=["chain-a"])
    up.submit("chain-c", "team", [PYTHON, "-c", step, str(order), "c"], gpu=1, after=["chain-b:ok"])
    done = {name: up.wait_status(name, timeout=60) for name in ("chain-a", "chain-b", "chain-c")}
    assert {w["status"] for w in done.values()} == {"succeeded"}
    assert order.read_text() == "a\nb\nc\n"
    assert done["chain-b"]["started_at"] >= done["chain-a"]["finished_at"]
    assert done["chain-c"]["started_at"] >= done["chain-b"]["finished_at"]
    assert [e["kind"] for e in up.events("chain-c")][:2] == ["submitted", "released"]


def test_a_failed_dependency_blocks_or_cancels(up: CorralUp) -> None:
    up.submit("breaks", "team", ["sh", "-c", "exit 4"], gpu=1)
    up.submit("blocked", "team", ["true"], gpu=1, after=["breaks"])
    up.submit("doomed", "team", ["true"], gpu=1, after=["breaks"], kill_on_invalid_dep=True)
    up.submit("anyway", "team", ["true"], gpu=1, after=["breaks:any"])
    assert up.wait_status("breaks")["status"] == "failed"
    assert up.wait_status("anyway")["status"] == "succeeded"
    doomed = up.wait_status("doomed", "cancelled")
    assert doomed["reason"] == "cancelled: dependency team/breaks failed; it can never succeed"
    blocked = wait_until(
        lambda: (w := up.workload("blocked"))["reason"].startswith("dependency") and w,
        30,
        "the blocked workload's reason",
    )
    assert blocked["status"] == "pending" and blocked["started_at"] is None
    why = up.get("/workloads/blocked/why")
    assert why["reason"].startswith("dependency team/breaks failed; it can never succeed")
    history = {row["name"]: row for row in up.get("/history", project="team")}
    assert history["breaks"]["exit_code"] == 4


def test_cancel_stops_the_process_and_keeps_the_record(up: CorralUp) -> None:
    up.submit("long", "team", ["sleep", "600"], gpu=1, grace_period=1)
    wait_until(lambda: up.started_pids("long"), 30, "the task to start")
    [(_, pid)] = up.started_pids("long")
    with up.client() as client:
        response = client.post("/workloads/long/cancel")
    assert response.status_code == 200, response.text
    wait_until(lambda: not running(pid), 30, "the task's process to end")
    record = up.workload("long")
    assert record["status"] == "cancelled" and record["cancelled_by"] == "admin"
    [row] = [r for r in up.get("/history", state="cancelled") if r["name"] == "long"]
    assert row["run_seconds"] > 0 and row["finished_at"] is not None
    # Its end, reported by the agent after the cancel, changes nothing.
    assert up.workload("long")["status"] == "cancelled"
