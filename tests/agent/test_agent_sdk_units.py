"""corral.sdk for users' code: checkpoints, the preemption request, the GPU fraction."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.sdk import gpu_fraction, limit_gpu_memory, preemption


def test_save_and_load_latest_round_trip_and_rotation(tmp_path: Path) -> None:
    assert preemption.load_latest(tmp_path) is None
    assert preemption.latest_checkpoint(tmp_path) is None
    paths = [preemption.save({"step": step}, tmp_path, keep=3) for step in range(1, 6)]
    assert [p.name for p in paths] == [f"checkpoint-{n:08d}.pkl" for n in range(1, 6)]
    # Only the newest three are kept, oldest first; the latest is the last saved.
    assert preemption.checkpoints(tmp_path) == paths[2:]
    # (and the marker `save` touches to tell corral it checkpointed).
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == [preemption.CHECKPOINT_MARKER, *(p.name for p in paths[2:])]
    assert preemption.latest_checkpoint(tmp_path) == paths[-1]
    assert preemption.load_latest(tmp_path) == {"step": 5}
    # Numbering goes on after the rotation.
    assert preemption.save({"step": 6}, tmp_path).name == "checkpoint-00000006.pkl"
    assert preemption.load_latest(tmp_path) == {"step": 6}


def test_numbers_order_checkpoints_not_names_and_strays_are_ignored(tmp_path: Path) -> None:
    # Past 99999999 the names stop sorting as strings; numbers still order them.
    (tmp_path / "checkpoint-99999999.pkl").write_bytes(pickle.dumps("older"))
    (tmp_path / "checkpoint-100000000.pkl").write_bytes(pickle.dumps("newer"))
    # A crash's half-written temporary file and files that are not checkpoints.
    (tmp_path / "tmpk3j2h1.tmp").write_bytes(b"\x80\x04torn")
    (tmp_path / "checkpoint-best.pkl").write_bytes(b"not a numbered checkpoint")
    (tmp_path / "notes.txt").write_text("hello")
    assert preemption.load_latest(tmp_path) == "newer"
    assert preemption.save("next", tmp_path).name == "checkpoint-100000001.pkl"


def test_checkpoint_dir_is_corral_checkpoint_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "checkpoints" / "my-job"
    monkeypatch.setenv("CORRAL_CHECKPOINT_DIR", str(target))
    assert preemption.checkpoint_dir() == target and target.is_dir()
    path = preemption.save({"w": 1.5})
    assert path.parent == target
    assert preemption.load_latest() == {"w": 1.5}


WRITER = """
import sys
from pathlib import Path
from corral.sdk import preemption
folder = Path(sys.argv[1])
print("writing", flush=True)
step = 0
while True:
    step += 1
    preemption.save({"step": step, "payload": bytes(2_000_000)}, folder, keep=2)
"""


def test_a_writer_killed_mid_save_never_leaves_a_torn_checkpoint(tmp_path: Path) -> None:
    """SIGKILL a process that saves large checkpoints in a loop, at several moments: what
    load_latest finds is always a whole checkpoint."""
    for round_ in range(4):
        folder = tmp_path / f"round-{round_}"
        folder.mkdir()
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder)], stdout=subprocess.PIPE, text=True
        )
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        deadline = time.monotonic() + 30
        while len(preemption.checkpoints(folder)) < 1 + round_ % 3:
            assert time.monotonic() < deadline, "the writer wrote nothing"
            time.sleep(0.01)
        time.sleep(0.013 * round_)
        writer.kill()
        writer.wait(timeout=10)
        writer.stdout.close()
        state = preemption.load_latest(folder)
        assert state is not None and state["step"] >= 1
        assert state["payload"] == bytes(2_000_000)
        assert len(preemption.checkpoints(folder)) <= 3


HANDLER = """
import sys, time
from corral.sdk import preemption
if sys.argv[1] == "install":
    preemption.install()
print("ready", preemption.requested(), flush=True)
deadline = time.monotonic() + 20
while not preemption.requested() and time.monotonic() < deadline:
    time.sleep(0.02)
print("stopping", preemption.requested(), flush=True)
sys.exit(0 if preemption.requested() else 5)
"""


def _run_and_terminate(mode: str) -> tuple[int, str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HANDLER, mode], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    first = child.stdout.readline()
    os.kill(child.pid, signal.SIGTERM)
    rest = child.stdout.read()
    child.stdout.close()
    return child.wait(timeout=30), first + rest


def test_install_turns_a_real_sigterm_into_requested() -> None:
    code, output = _run_and_terminate("install")
    assert output == "ready False\nstopping True\n"
    assert code == 0


def test_without_install_sigterm_kills_as_usual() -> None:
    code, output = _run_and_terminate("plain")
    assert output == "ready False\n"
    assert code == -signal.SIGTERM


def test_gpu_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_GPU_FRACTION", raising=False)
    assert gpu_fraction() is None
    monkeypatch.setenv("CORRAL_GPU_FRACTION", "")
    assert gpu_fraction() is None
    monkeypatch.setenv("CORRAL_GPU_FRACTION", "0.5")
    assert gpu_fraction() == 0.5
    monkeypatch.setenv("CORRAL_GPU_FRACTION", "0.25")
    assert gpu_fraction() == 0.25


def test_limit_gpu_memory_does_nothing_for_whole_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CORRAL_GPU_FRACTION", raising=False)
    # Whole devices: torch is not even imported (it is not installed here).
    assert limit_gpu_memory() is None


class _Cuda:
    """PyTorch's torch.cuda surface that limit_gpu_memory uses; PyTorch with CUDA cannot
    run on this machine, so its calls are recorded instead."""

    def __init__(self, devices: int, available: bool = True) -> None:
        self.devices = devices
        self.available = available
        self.calls: list[tuple[float, int]] = []

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return self.devices

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        self.calls.append((fraction, device))


class _Torch:
    def __init__(self, cuda: _Cuda) -> None:
        self.cuda = cuda


def test_limit_gpu_memory_caps_every_visible_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_GPU_FRACTION", "0.5")
    cuda = _Cuda(devices=2)
    assert limit_gpu_memory(_Torch(cuda)) == 0.5
    assert cuda.calls == [(0.5, 0), (0.5, 1)]
    idle = _Cuda(devices=1, available=False)
    assert limit_gpu_memory(_Torch(idle)) == 0.5
    assert idle.calls == []
