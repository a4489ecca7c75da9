"""How an agent learns when a task last checkpointed (corral.agent.checkpoints), from the
marker `corral.sdk.checkpointed()` touches or the task's newest checkpoint file, reading a
directory the task owns as if the task were hostile; and how the Ray node agent carries
the times to the server. Real files, real processes, a real agent."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import PYTHON, wait_until

from corral.agent import checkpoints
from corral.agent.checkpoints import MARKER, last_checkpoint
from corral.cluster.ray_agent import NodeAgent
from corral.messages import AgentSettings, TaskLaunch, TaskStop
from corral.sdk import checkpointed, preemption

NOW = 2_000_000_000.0


def _folder(root: Path, workload: str = "job") -> Path:
    folder = root / workload / "checkpoints"
    folder.mkdir(parents=True)
    return folder


def _file(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_nothing_known_without_a_checkpoint_directory_or_files(tmp_path: Path) -> None:
    assert last_checkpoint(tmp_path / "job", NOW) is None
    (tmp_path / "job").mkdir()
    assert last_checkpoint(tmp_path / "job", NOW) is None
    _folder(tmp_path, "empty")
    assert last_checkpoint(tmp_path / "empty", NOW) is None


def test_the_newest_file_counts_one_level_down_not_temporary_or_hidden(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _file(folder / "step-100.pt", NOW - 500)
    _file(folder / "step-200" / "model.safetensors", NOW - 300)
    # Not checkpoints: one being written, hidden files, and anything two levels down.
    _file(folder / "step-300.pt.tmp", NOW - 10)
    _file(folder / ".lock", NOW - 10)
    _file(folder / "step-200" / ".partial", NOW - 10)
    _file(folder / "deep" / "er" / "file", NOW - 10)
    assert last_checkpoint(tmp_path / "job", NOW) == NOW - 300


def test_the_marker_wins_over_files(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _file(folder / "step-100.pt", NOW - 10)
    _file(folder / MARKER, NOW - 400)
    # The task said when its checkpoint was complete; a newer file may be a half-written
    # next one, or its logs.
    assert last_checkpoint(tmp_path / "job", NOW) == NOW - 400


def test_a_time_in_the_future_counts_as_now(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _file(folder / MARKER, NOW + 86400)
    assert last_checkpoint(tmp_path / "job", NOW) == NOW


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    _file(elsewhere / "secret", NOW - 5)
    _file(elsewhere / MARKER, NOW - 5)
    # The checkpoint directory itself a link (to a directory the task could not list).
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "checkpoints").symlink_to(elsewhere)
    assert last_checkpoint(tmp_path / "linked", NOW) is None
    # The workload's directory a link.
    (tmp_path / "alias").symlink_to(tmp_path / "linked")
    assert last_checkpoint(tmp_path / "alias", NOW) is None
    # Links inside: to a file, to a directory, and as the marker.
    folder = _folder(tmp_path)
    _file(folder / "real.pt", NOW - 900)
    (folder / "to-file").symlink_to(elsewhere / "secret")
    (folder / "to-dir").symlink_to(elsewhere)
    (folder / MARKER).symlink_to(elsewhere / MARKER)
    assert last_checkpoint(tmp_path / "job", NOW) == NOW - 900


def test_a_fifo_does_not_stall_and_counts_for_nothing(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    os.mkfifo(folder / MARKER)
    os.mkfifo(folder / "pipe")
    _file(folder / "real.pt", NOW - 60)
    assert last_checkpoint(tmp_path / "job", NOW) == NOW - 60


def test_a_huge_directory_costs_a_bounded_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "MAX_ENTRIES", 50)
    looked: list[str] = []
    real = checkpoints._lstat

    def counted(entry: os.DirEntry[str]) -> os.stat_result | None:
        looked.append(entry.name)
        return real(entry)

    monkeypatch.setattr(checkpoints, "_lstat", counted)
    folder = _folder(tmp_path)
    for number in range(100):
        _file(folder / f"dir{number:03d}" / "model.pt", NOW - 1000 + number)
    found = last_checkpoint(tmp_path / "job", NOW)
    # Directories and the files in them share one budget of 50 entries.
    assert len(looked) == 50
    assert found is not None and NOW - 1000 <= found < NOW - 900


def test_checkpointed_touches_the_marker_the_agent_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_CHECKPOINT_DIR", raising=False)
    # Outside corral, with no directory given: nothing to tell.
    assert checkpointed() is False
    folder = tmp_path / "job" / "checkpoints"
    monkeypatch.setenv("CORRAL_CHECKPOINT_DIR", str(folder))
    before = time.time()
    assert checkpointed() is True
    found = last_checkpoint(tmp_path / "job", time.time() + 60)
    assert found is not None and before - 1 <= found <= time.time()
    # `save` says it too.
    os.utime(folder / MARKER, (1.0, 1.0))
    preemption.save({"step": 1})
    found = last_checkpoint(tmp_path / "job", time.time() + 60)
    assert found is not None and found >= before - 1
    # A symlink planted as the marker is not written through.
    (folder / MARKER).unlink()
    target = tmp_path / "target"
    target.write_text("keep")
    (folder / MARKER).symlink_to(target)
    with pytest.raises(OSError):
        checkpointed()
    assert target.read_text() == "keep"


# -- the Ray node agent's side (no Ray needed: the actor's body is a plain class) ----------

TOLD = """
import sys, time
from corral.sdk import checkpointed
assert checkpointed()
print("checkpointed", flush=True)
time.sleep(600)
"""


@pytest.fixture
def node_agent(tmp_path: Path) -> Iterator[tuple[NodeAgent, Path]]:
    workloads = Path(tempfile.mkdtemp(prefix="corral-ckpt-"))
    body = NodeAgent("n1", str(tmp_path / "agents"), AgentSettings(60.0), 1, str(workloads))
    body.agent.heartbeat_interval = 0.0
    yield body, workloads
    body.stop([TaskStop("job", "n1", (0,), "the test is over", 0.0)])
    wait_until(lambda: not body.drain()["running"], 30, "the task to stop")
    body.close()
    shutil.rmtree(workloads, ignore_errors=True)


def test_the_ray_node_agent_drains_checkpoint_times(
    node_agent: tuple[NodeAgent, Path],
) -> None:
    body, workloads = node_agent
    launch = TaskLaunch(
        workload="job",
        project="p",
        task=0,
        attempt=1,
        node="n1",
        devices=(0,),
        gpu=1.0,
        command=(PYTHON, "-c", TOLD),
        unix_user="root" if os.geteuid() == 0 else None,
    )
    body.start([launch])
    found: dict[str, float] = {}

    def reported() -> bool:
        found.update(body.drain()["checkpoints"])
        return "job" in found

    wait_until(reported, 30, "a checkpoint time in a drain")
    marker = workloads / "job" / "checkpoints" / MARKER
    assert found["job"] == marker.stat().st_mtime
    # Reported once: later drains say nothing until it checkpoints again.
    assert body.drain()["checkpoints"] == {}
