"""The scheduler's kept snapshot and state checked against the store, cycle after cycle, on
a live `corral up`: the other tests' servers run as corral ships, without the check
(CORRAL_VERIFY_SNAPSHOTS, corral.control.scheduler); this one and the chaos test turn it on.

Two projects share four virtual GPUs with every kind of work: training that borrows and
is reclaimed, gangs, fractions, elastic work, interactive work and inference that preempts.
Tasks start, end and are preempted, so cycles run on kept snapshots with the workloads
that changed read again, and on full reads. A difference fails the cycle with a line in
the server's log."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import CorralUp

SLEEP = ["/bin/sleep", "1.5"]
WORK = {
    "borrow": {"tasks": [{"replicas": 1, "gpu": 1}], "project": "alpha"},
    "gang": {"tasks": [{"replicas": 2, "gpu": 1}], "min_available": 2, "project": "alpha"},
    "fraction": {"tasks": [{"replicas": 1, "gpu": 0.5}], "project": "beta"},
    "elastic": {"tasks": [{"replicas": 3, "gpu": 0.5}], "min_available": 1, "project": "beta"},
    "interactive": {"tasks": [{"replicas": 1, "gpu": 1}], "priority": "interactive"},
    "inference": {"tasks": [{"replicas": 1, "gpu": 0.25}], "priority": "inference"},
}


@pytest.fixture
def verified(tmp_path: Path) -> Iterator[CorralUp]:
    up = CorralUp(tmp_path / "corral", 4, env={"CORRAL_VERIFY_SNAPSHOTS": "1"})
    try:
        up.start()
        for project in ("alpha", "beta"):
            up.queue(project, 2)
        yield up
    finally:
        left = up.close()
        if left:
            warnings.warn(f"killed task processes left behind: {left}", stacklevel=1)


def test_kept_snapshots_and_state_agree_with_the_store_through_a_mixed_workload(
    verified: CorralUp,
) -> None:
    up = verified
    assert up.process is not None
    environ = Path(f"/proc/{up.process.pid}/environ").read_bytes().split(b"\0")
    assert b"CORRAL_VERIFY_SNAPSHOTS=1" in environ
    names = []
    # alpha borrows every GPU first; beta's work then takes its share back.
    for round_ in range(3):
        for kind in ("borrow", "gang", "fraction", "elastic", "interactive", "inference"):
            body = WORK[kind]
            project = body.get("project", ("alpha", "beta")[round_ % 2])
            name = f"{kind}-{round_}"
            up.post("/workloads", {"name": name, "command": SLEEP, **body, "project": project})
            names.append(name)
    for name in names:
        done = up.wait_status(name, timeout=120)
        assert done["status"] == "succeeded", done
    summary = up.get("/cluster")
    assert summary["workloads"]["pending"] == 0 and summary["workloads"]["running"] == 0, summary
    checked = [
        line
        for line in up.log.read_text().splitlines()
        if "kept snapshot" in line or "kept state" in line
    ]
    assert not checked, "\n".join(checked[:5])
