"""For training code: notice preemption, checkpoint, and resume where it left off.

corral stops a task with SIGTERM, waits its grace period (30 s unless the workload says
otherwise), then sends SIGKILL. A task that checkpoints when asked and loads its latest
checkpoint at start loses no more than the work since that checkpoint:

    from corral.sdk import preemption

    preemption.install()
    state = preemption.load_latest() or fresh_state()
    while not done(state):
        step(state)
        if preemption.requested() or time_for_a_checkpoint():
            preemption.save(state)
        if preemption.requested():
            break            # exit 0 within the grace period; corral requeues the workload

The checkpoint directory is `CORRAL_CHECKPOINT_DIR`, the same on every run of a workload.

corral prefers, among equal victims of preemption, those that lose the least work since
their last checkpoint, and `corral describe` says how much a preempted workload lost. Code
that writes its own checkpoints says when it did with `checkpointed()` (`save` does it);
without it, corral takes the newest file in the checkpoint directory as the last one.
"""

from __future__ import annotations

import os
import pickle
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

_requested = threading.Event()
CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_DIR_ENV = "CORRAL_CHECKPOINT_DIR"
# Touched by `checkpointed()`; its agent reads its time (corral.agent.checkpoints.MARKER).
CHECKPOINT_MARKER = ".corral-checkpointed"


def install() -> None:
    """Turn SIGTERM into a request to stop: `requested()` becomes True, nothing is killed."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        _requested.set()

    signal.signal(signal.SIGTERM, handler)


def requested() -> bool:
    """True once corral has asked this task to stop (preemption, suspension, deletion)."""
    return _requested.is_set()


def checkpoint_dir() -> Path:
    """Where to keep checkpoints: CORRAL_CHECKPOINT_DIR, or ./checkpoints outside corral."""
    path = Path(os.environ.get(CHECKPOINT_DIR_ENV, "checkpoints"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _number(path: Path) -> int:
    return int(path.stem[len(CHECKPOINT_PREFIX) :])


def checkpoints(directory: Path | None = None) -> list[Path]:
    """The checkpoints written by `save`, oldest first."""
    folder = directory or checkpoint_dir()
    found = []
    for path in folder.glob(f"{CHECKPOINT_PREFIX}*.pkl"):
        suffix = path.stem[len(CHECKPOINT_PREFIX) :]
        if suffix.isdigit():
            found.append(path)
    return sorted(found, key=_number)


def latest_checkpoint(directory: Path | None = None) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = checkpoints(directory)
    return found[-1] if found else None


def save(state: Any, directory: Path | None = None, keep: int = 3) -> Path:
    """Write `state` as the next checkpoint, atomically (a crash never leaves a torn file),
    and keep only the newest `keep` checkpoints."""
    folder = directory or checkpoint_dir()
    existing = checkpoints(folder)
    number = _number(existing[-1]) + 1 if existing else 1
    target = folder / f"{CHECKPOINT_PREFIX}{number:08d}.pkl"
    with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as handle:
        pickle.dump(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(handle.name, target)
    for old in checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    checkpointed(folder)
    return target


def checkpointed(directory: Path | None = None) -> bool:
    """Tell corral a checkpoint was taken just now (call it once the checkpoint is
    complete), so that preemption prefers other victims and counts only the work since.

    It touches a marker in the checkpoint directory (`directory`, else
    CORRAL_CHECKPOINT_DIR), whose time the agent reads. Returns False, and does nothing,
    outside a corral task when no directory is given."""
    if directory is None:
        if not os.environ.get(CHECKPOINT_DIR_ENV):
            return False
        directory = checkpoint_dir()
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / CHECKPOINT_MARKER
    # Not through a symlink someone left in its place: the marker is a plain file.
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.utime(fd)
    finally:
        os.close(fd)
    return True


def load_latest(directory: Path | None = None) -> Any | None:
    """The state of the newest checkpoint, or None when there is none."""
    latest = latest_checkpoint(directory)
    if latest is None:
        return None
    with open(latest, "rb") as handle:
        return pickle.load(handle)
