"""The chaos suite's invariant checks catch what they claim to: each is given a sound
state, then the same state with one violation planted."""

from __future__ import annotations

import invariants as inv

SOUND = [
    inv.StoredWorkload("w-1", "0-0", "running", 1, "bound"),
    inv.StoredWorkload("w-2", "0-1", "pending", 0, "preempted"),
    inv.StoredWorkload("w-3", "1-0", "running", 2, "preempted"),  # an elastic one shrank
    inv.StoredWorkload("w-4", "1-1", "succeeded", 0, "succeeded"),
]
ACKNOWLEDGED = {"0-0": "w-1", "0-1": "w-2", "1-0": "w-3"}
SENT = {"0-0", "0-1", "1-0", "1-1", "1-2"}


def test_submissions_lost_duplicated_or_never_sent_are_caught() -> None:
    tally = inv.Tally()
    assert inv.submissions(ACKNOWLEDGED, SENT, SOUND, tally) == []
    lost = inv.submissions(ACKNOWLEDGED, SENT, SOUND[1:], tally)
    assert lost == ["acknowledged 0-0 (w-1) is lost"]
    twice = [*SOUND, inv.StoredWorkload("w-9", "0-1", "pending", 0, None)]
    assert "0-1 is stored 2 times" in inv.submissions(ACKNOWLEDGED, SENT, twice, tally)
    unknown = [*SOUND, inv.StoredWorkload("w-8", "7-7", "pending", 0, None)]
    assert inv.submissions(ACKNOWLEDGED, SENT, unknown, tally) == ["7-7 was never sent"]
    assert tally.evaluations["submissions"] == 4 and tally.items["submissions"] == 12


def test_a_preempted_workload_that_was_not_requeued_is_caught() -> None:
    tally = inv.Tally()
    assert inv.requeued(SOUND, tally) == []
    stuck = [*SOUND, inv.StoredWorkload("w-5", "2-0", "running", 0, "preempted")]
    assert inv.requeued(stuck, tally) == ["w-5 was preempted but is running with 0 placements"]
    gone = [*SOUND, inv.StoredWorkload("w-6", "2-1", "failed", 0, "preempted")]
    assert len(inv.requeued(gone, tally)) == 1


def test_an_overcommitted_device_is_caught() -> None:
    tally = inv.Tally()
    fine = [("n", 0, 0.5), ("n", 0, 0.25), ("n", 0, 0.25), ("n", 1, 1.0)]
    assert inv.overcommit(fine, "store", tally) == []
    over = inv.overcommit([*fine, ("n", 1, 0.25)], "store", tally)
    assert over == ["store: n device 1 is committed 1.25 times"]


def test_unknown_misplaced_stale_and_doubled_processes_are_caught() -> None:
    tally = inv.Tally()
    bound = {("w-1", 0): inv.Binding((0,), 1.0, 100), ("w-1", 1): inv.Binding((1,), 1.0, None)}
    good = [inv.TaskProcess(101, 100, "w-1", 0, (0,), 1.0)]
    assert inv.processes(good, bound, tally) == []
    orphan = [*good, inv.TaskProcess(201, 200, "w-7", 0, (2,), 1.0)]
    assert inv.processes(orphan, bound, tally) == ["w-7/0 (pid 201) runs but is not bound"]
    moved = [inv.TaskProcess(101, 100, "w-1", 0, (3,), 1.0)]
    assert "runs on (3,) x 1, bound to (0,) x 1" in inv.processes(moved, bound, tally)[0]
    half = [inv.TaskProcess(101, 100, "w-1", 0, (0,), 0.5)]
    assert "runs on (0,) x 0.5, bound to (0,) x 1" in inv.processes(half, bound, tally)[0]
    stale = [inv.TaskProcess(301, 300, "w-1", 0, (0,), 1.0)]
    assert "not the process the server knows" in inv.processes(stale, bound, tally)[0]
    twice = [*good, inv.TaskProcess(401, 400, "w-1", 0, (0,), 1.0)]
    problems = inv.processes(twice, bound, tally)
    assert "w-1/0 runs 2 times: groups [100, 400]" in problems
