"""Checkpoint-aware preemption end to end: a real `corral up` (server and agent) and real
task processes that say when they checkpoint with `corral.sdk.checkpointed()`.

- A task checkpoints, its agent reports it, higher-priority work preempts it, and
  `corral describe` says how much work it lost, counted from that checkpoint.
- A task that checkpoints when asked to stop (`corral.sdk.preemption`) lost nothing.
- Two running workloads that differ only in when they last checkpointed: the one with
  the more recent checkpoint is the victim (it loses less), although it is the older one,
  which newest-first would have kept."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from livecorral import CORRAL, PYTHON, CorralUp, Servers, wait_until

# Checkpoints once the file argv[1] exists, says so, then runs until stopped.
CHECKPOINT_WHEN_TOLD = """
import os, sys, time
from corral.sdk import checkpointed
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
assert checkpointed()
print("checkpointed", flush=True)
time.sleep(600)
"""


def _checkpointing(up: CorralUp, name: str, go: Path, **more: Any) -> None:
    up.submit(name, "q", [PYTHON, "-c", CHECKPOINT_WHEN_TOLD, str(go)], gpu=1, **more)


def _urgent(up: CorralUp) -> None:
    """One GPU of inference in the same project: it preempts a training job."""
    up.submit(
        "urgent", "q", [PYTHON, "-c", "import time; time.sleep(600)"], gpu=1, priority="inference"
    )


def _reported(up: CorralUp, name: str) -> float:
    """The checkpoint time the server has for `name`, once its agent reported one."""
    found = wait_until(
        lambda: up.workload(name)["checkpoint_at"], 30, f"a checkpoint of {name} reported"
    )
    return float(found)


def _nudge_a_full_read(up: CorralUp, name: str) -> None:
    """A new project changes the queues, so the scheduler's next cycle reads the whole
    store (checkpoint times included) rather than its kept snapshot, which lets times lag
    for up to 10 s by design."""
    up.queue(name, 0)


def _describe(up: CorralUp, name: str) -> str:
    env = {
        **os.environ,
        "CORRAL_SERVER": up.url,
        "CORRAL_TOKEN": up.token,
        "HOME": str(up.data_dir),
        "COLUMNS": "200",
    }
    done = subprocess.run(
        [CORRAL, "describe", name], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_describe_says_how_much_work_a_preemption_lost_since_the_checkpoint(
    corral_up: Servers, tmp_path: Path
) -> None:
    up = corral_up(1, {"q": 1})
    go = tmp_path / "go"
    _checkpointing(up, "train", go, grace_period=1)
    up.wait_status("train", "running")
    go.touch()
    up.wait_log("train", "checkpointed")
    checkpoint = _reported(up, "train")
    started = up.workload("train")["placements"]
    assert started, "train runs"

    _urgent(up)
    [event] = wait_until(lambda: up.events("train", "preempted"), 30, "train to be preempted")
    record = up.workload("train")
    assert record["status"] == "pending"
    lost = record["lost_work"]
    assert lost is not None and lost["from_checkpoint"] is True
    # Counted from the checkpoint it reported, not from its start: one GPU for the time
    # between that checkpoint and the preemption.
    assert lost["since"] == checkpoint
    assert abs(lost["gpu_seconds"] - (lost["at"] - checkpoint)) < 1e-6
    assert lost["summary"].startswith("lost ") and "of work: last checkpoint " in lost["summary"]
    assert lost["summary"].endswith(" before preemption")
    assert event["reason"].endswith(lost["summary"])

    described = _describe(up, "train")
    line = next(line for line in described.splitlines() if line.startswith("preempted"))
    assert lost["summary"] in line, described
    assert any(line.startswith("last checkpoint") for line in described.splitlines())


# Checkpoints when SIGTERM asks it to stop, and only then.
SAVES_WHEN_ASKED = """
import time
from corral.sdk import preemption
preemption.install()
print("running", flush=True)
while not preemption.requested():
    time.sleep(0.05)
preemption.save({"step": 1})
print("saved", flush=True)
"""


def test_a_task_that_checkpoints_when_asked_to_stop_lost_nothing(corral_up: Servers) -> None:
    up = corral_up(1, {"q": 1})
    up.submit("polite", "q", [PYTHON, "-c", SAVES_WHEN_ASKED], gpu=1, grace_period=20)
    up.wait_status("polite", "running")
    up.wait_log("polite", "running")
    _urgent(up)
    wait_until(lambda: up.events("polite", "preempted"), 30, "polite to be preempted")
    up.wait_log("polite", "saved")

    def lost_nothing() -> Any:
        lost = up.workload("polite")["lost_work"]
        return lost if lost and lost["gpu_seconds"] == 0 else None

    lost = wait_until(lost_nothing, 30, "the record to say polite lost nothing")
    assert lost["summary"] == "lost no work: it checkpointed when asked to stop"
    assert lost["since"] > lost["at"] and lost["from_checkpoint"]
    [event] = up.events("polite", "preempted")
    # The event says what was known at the preemption: everything since its start.
    assert "no checkpoint known" in event["reason"]


def test_of_two_equal_victims_the_one_with_the_newer_checkpoint_is_preempted(
    corral_up: Servers, tmp_path: Path
) -> None:
    up = corral_up(2, {"q": 2})
    older, newer = tmp_path / "older", tmp_path / "newer"
    # "first" is submitted first: newest-first victims would take "second". "second"
    # checkpoints first and "first" after it, so "first" has less work to lose.
    _checkpointing(up, "first", newer)
    _checkpointing(up, "second", older)
    for name in ("first", "second"):
        up.wait_status(name, "running")
    older.touch()
    up.wait_log("second", "checkpointed")
    at_second = _reported(up, "second")
    newer.touch()
    up.wait_log("first", "checkpointed")
    at_first = _reported(up, "first")
    assert at_first > at_second
    _nudge_a_full_read(up, "nudge")

    _urgent(up)
    wait_until(lambda: up.events("first", "preempted"), 30, "first to be preempted")
    assert up.wait_status("urgent", "running")["status"] == "running"
    assert up.workload("second")["status"] == "running"
    assert not up.events("second", "preempted")
    lost = up.workload("first")["lost_work"]
    assert lost["from_checkpoint"] and lost["since"] == at_first
