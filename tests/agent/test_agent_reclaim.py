"""The reclaim story end to end, with real training processes and real signals.

Two virtual GPUs; team-a and team-b each deserve one. team-a's two training jobs borrow
both; team-b's job takes its GPU back. One team-a job gets SIGTERM, checkpoints and exits
within its grace period, waits, and later resumes from that checkpoint and finishes."""

from __future__ import annotations

import re
from pathlib import Path

from livecorral import DEVICE_CHECK, PYTHON, DeviceWatch, Servers, wait_until

from corral.sdk import preemption

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")
STEPS = 160


def test_reclaim_preempts_one_borrower_which_checkpoints_and_resumes(corral_up: Servers) -> None:
    up = corral_up(2, {"team-a": 1, "team-b": 1})
    train = [PYTHON, TRAIN, "--steps", str(STEPS), "--step-seconds", "0.1"]
    train += ["--checkpoint-every", "10"]
    for name in ("a-train-1", "a-train-2"):
        up.submit(name, "team-a", train, gpu=1, grace_period=10)
    for name in ("a-train-1", "a-train-2"):
        assert up.wait_status(name, "running")["status"] == "running"
        up.wait_log(name, "starting from scratch")
    nodes = up.get("/nodes")
    assert nodes[0]["allocated_gpu"] == 2  # team-a borrows team-b's GPU

    with DeviceWatch(up.workloads_dir) as watch:
        up.submit("b-job", "team-b", [PYTHON, "-c", DEVICE_CHECK, "5"], gpu=1)

        # Exactly one team-a job is evicted, for b-job.
        def evicted() -> list[str]:
            return [n for n in ("a-train-1", "a-train-2") if up.events(n, "preempted")]

        [victim] = wait_until(evicted, 30, "a team-a job to be preempted")
        survivor = "a-train-2" if victim == "a-train-1" else "a-train-1"
        [event] = up.events(victim, "preempted")
        assert event["reason"].startswith("preempted: ")
        assert "b-job" in event["reason"]
        record = up.workload(victim)
        assert record["status"] == "pending", record
        # (Its reason is the scheduler's current reason for waiting; the event keeps the why.)
        assert record["reason"], record

        # It got SIGTERM, saved a checkpoint and exited by itself (code 0, not SIGKILL's 137)
        # well within its 10 s grace period.
        log = up.wait_log(victim, "preempted at step", timeout=20)
        step = int(re.search(r"preempted at step (\d+); checkpoint saved", log).group(1))  # type: ignore[union-attr]
        assert 0 < step < STEPS
        exit_file = up.data_dir / "run" / up.directory(victim) / "task-0.exit"
        wait_until(exit_file.exists, 20, "the victim's exit code")
        assert exit_file.read_text().strip() == "0"
        checkpoints = up.workloads_dir / up.directory(victim) / "checkpoints"
        saved = preemption.load_latest(checkpoints)
        assert saved is not None and saved["step"] == step and saved["runs"] == 1

        # b-job runs, and nothing else was ever alive on its device beside it.
        assert up.wait_status("b-job", timeout=30)["status"] == "succeeded"
    assert "check done" in up.log_text("b-job")
    assert not any("b-job" in pair for pair in watch.together), watch.together

    # The victim runs again once b-job is done, continuing from its checkpoint.
    done = up.wait_status(victim, timeout=90)
    assert done["status"] == "succeeded", done
    log = up.log_text(victim)
    assert log.count("starting from scratch") == 1
    assert re.findall(r"resuming from step (\d+)", log) == [str(step)]
    assert log.count("preempted at step") == 1
    assert f"done: step {STEPS}," in log and log.rstrip().endswith("runs 2")
    final = preemption.load_latest(checkpoints)
    assert final is not None and final["step"] == STEPS and final["runs"] == 2
    assert done["attempts"] == 2
    # Preemption is not a failure: no retry was used.
    assert not up.events(victim, "retrying") and not up.events(victim, "failed")
    started = up.events(victim, "task-started")
    assert len(started) == 2
    [b_finished] = up.events("b-job", "succeeded")
    [b_started] = up.events("b-job", "task-started")
    assert started[0]["time"] < b_started["time"] and b_finished["time"] <= started[1]["time"]

    # The other team-a job was never touched.
    assert up.wait_status(survivor, timeout=60)["status"] == "succeeded"
    assert not up.events(survivor, "preempted")
    other = up.log_text(survivor)
    assert other.count("starting from scratch") == 1 and "resuming" not in other
    assert "preempted" not in other and other.rstrip().endswith("runs 1")
