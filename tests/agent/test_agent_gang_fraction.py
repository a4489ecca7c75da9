"""Gangs and fractions as the task processes see them: the environment each one gets."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from livecorral import (
    DEVICE_CHECK,
    PYTHON,
    CorralUp,
    DeviceWatch,
    Servers,
    processes_of,
    wait_until,
)

SHOWN = (
    "CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES|CORRAL_[A-Z_]+|TF_FORCE_GPU_ALLOW_GROWTH|"
    "MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK|NODE_RANK"
)
PRINT_ENV = f'env | grep -E "^({SHOWN})=" | sort'


def parse_env(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if "=" in line]
    return {key: value for key, value in pairs}


@pytest.fixture(scope="module")
def four(module_corral_up: Servers) -> Iterator[CorralUp]:
    """A 4-GPU node, shared by the tests of this module (each waits for its work to end)."""
    yield module_corral_up(4, {"research": 4})


def test_a_gang_gets_a_consistent_world_and_starts_whole(four: CorralUp) -> None:
    up = four
    up.submit("gang", "research", ["sh", "-c", PRINT_ENV], gpu=1, replicas=3)
    done = up.wait_status("gang", timeout=30)
    assert done["status"] == "succeeded", done

    envs = [parse_env(up.log_text("gang", task)) for task in range(3)]
    assert up.logs("gang", 0)["tasks"] == [0, 1, 2]
    assert {env["WORLD_SIZE"] for env in envs} == {"3"}
    assert [env["RANK"] for env in envs] == ["0", "1", "2"]
    assert [env["CORRAL_TASK_INDEX"] for env in envs] == ["0", "1", "2"]
    assert [env["LOCAL_RANK"] for env in envs] == ["0", "1", "2"]  # one node
    assert {env["NODE_RANK"] for env in envs} == {"0"}
    assert len({env["MASTER_ADDR"] for env in envs}) == 1 and envs[0]["MASTER_ADDR"]
    assert len({env["MASTER_PORT"] for env in envs}) == 1
    assert 0 < int(envs[0]["MASTER_PORT"]) < 65536
    devices = [env["CUDA_VISIBLE_DEVICES"] for env in envs]
    assert len(set(devices)) == 3 and all(d in {"0", "1", "2", "3"} for d in devices)
    assert [env["NVIDIA_VISIBLE_DEVICES"] for env in envs] == devices
    assert {env["CORRAL_WORKLOAD"] for env in envs} == {"gang"}
    assert {env["CORRAL_PROJECT"] for env in envs} == {"research"}
    assert {env["CORRAL_CHECKPOINT_DIR"] for env in envs} == {
        str(up.workloads_dir / up.directory("gang") / "checkpoints")
    }
    assert not any("CORRAL_GPU_FRACTION" in env for env in envs)
    # All three were bound at once.
    [bound] = up.events("gang", "bound")
    assert bound["reason"].startswith("3 tasks")
    assert len(up.events("gang", "task-started")) == 3


def test_two_halves_share_one_device_and_are_told_their_share(four: CorralUp) -> None:
    up = four
    assert up.get("/nodes")[0]["allocated_gpu"] == 0  # all four devices free: packing decides
    memory = {d["index"]: d["memory"] for d in up.get("/nodes")[0]["devices"]}
    command = ["sh", "-c", f'{PRINT_ENV}; exec "$0" -c "$1" 3', PYTHON, DEVICE_CHECK]
    with DeviceWatch(up.workloads_dir) as watch:
        for name in ("half-1", "half-2"):
            up.submit(name, "research", command, gpu=0.5)

        def both_placed() -> list[dict[str, object]] | None:
            placed = [p for n in ("half-1", "half-2") for p in up.workload(n)["placements"]]
            return placed if len(placed) == 2 else None

        placed = wait_until(both_placed, 20, "both halves to run at once")
        assert placed[0]["devices"] == placed[1]["devices"] and len(placed[0]["devices"]) == 1
        assert [p["gpu"] for p in placed] == [0.5, 0.5]
        for name in ("half-1", "half-2"):
            assert up.wait_status(name, timeout=30)["status"] == "succeeded"
    halves = {name: up.log_text(name) for name in ("half-1", "half-2")}
    envs = [parse_env(text) for text in halves.values()]
    index = envs[0]["CUDA_VISIBLE_DEVICES"]
    assert index.isdigit() and envs[1]["CUDA_VISIBLE_DEVICES"] == index
    assert [index] == [str(device) for device in placed[0]["devices"]]
    for env in envs:
        assert env["CORRAL_GPU_FRACTION"] == "0.5"
        assert int(env["CORRAL_GPU_MEMORY_LIMIT"]) == memory[int(index)] // 2
        assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    # Both are bound to the device at once, so both processes run at once: each started
    # before the other ended, and their processes were seen on the device together.
    [start_1] = up.events("half-1", "task-started")
    [start_2] = up.events("half-2", "task-started")
    [end_1] = up.events("half-1", "task-exited")
    [end_2] = up.events("half-2", "task-exited")
    assert start_2["time"] < end_1["time"] and start_1["time"] < end_2["time"], (
        "the halves ran one after the other",
        [(e["time"], e["workload"], e["kind"]) for e in (start_1, end_1, start_2, end_2)],
    )
    assert watch.met("half-1", "half-2"), watch.together


def test_a_gang_that_cannot_fit_stays_pending_and_starts_nothing(corral_up: Servers) -> None:
    up = corral_up(2, {"research": 4})
    # One of the two GPUs is held by work that cannot be preempted; a gang of two fits the
    # pool (a gang larger than the pool is refused at submit) but not now.
    up.submit("holder", "research", ["sleep", "60"], gpu=1, priority="inference")
    wait_until(lambda: up.workload("holder")["status"] == "running", 20, "the holder")
    up.submit("too-big", "research", ["sh", "-c", "echo started"], gpu=1, replicas=2)
    pending = wait_until(
        lambda: w if (w := up.workload("too-big"))["reason"] else None,
        20,
        "a pending reason for the gang",
    )
    assert pending["status"] == "pending"
    # Several scheduling and reconciling cycles later, still nothing has started.
    time.sleep(3)
    record = up.workload("too-big")
    assert record["status"] == "pending" and record["placements"] == []
    # The reason says what it needs: two GPUs at once.
    assert "2 GPUs" in record["reason"], record
    kinds = {event["kind"] for event in up.events("too-big")}
    assert kinds == {"submitted"}, kinds
    assert up.logs("too-big", 0)["tasks"] == []
    assert not (up.data_dir / "logs" / up.directory("too-big")).exists()
    assert processes_of(up.workloads_dir / up.directory("too-big")) == []
    assert up.get("/nodes")[0]["allocated_gpu"] == 1
    # The holder is cancelled, and its process stopped, before the server goes.
    with up.client() as client:
        assert client.post("/workloads/holder/cancel").status_code == 200
    holder = up.workloads_dir / up.directory("holder")
    wait_until(lambda: processes_of(holder) == [], 20, "the holder to stop")
