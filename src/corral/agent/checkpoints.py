"""When a task last checkpointed, as its agent finds out without trusting the task.

A task says it with `corral.sdk.checkpointed()` (which `preemption.save` calls): that
touches the marker `.corral-checkpointed` in its CORRAL_CHECKPOINT_DIR, and the marker's
modification time is the checkpoint's. A task that never calls it is judged by its files:
the newest modification time of a regular file in the checkpoint directory or in a
directory directly below it (checkpoint frameworks write one directory per step), leaving
out hidden files and `*.tmp` (a checkpoint being written is not one yet).

The directory belongs to the task's account, and the agent may run as root, so the
reading is defensive: the workload's directory and its `checkpoints` are opened without
following a symlink (a link to /etc must not lend its times), entries are examined with
lstat and never opened, at most MAX_ENTRIES entries are looked at, and a time in the future
(a clock the task set forward with utime) counts as now.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

MARKER = ".corral-checkpointed"
CHECKPOINTS = "checkpoints"
# Entries looked at per scan, over both levels: a directory of a million files costs the
# agent this much and no more (the newest file may then be missed, and older times stand).
MAX_ENTRIES = 2000
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def last_checkpoint(workload_dir: Path, now: float) -> float | None:
    """When the task(s) of the workload whose own directory is `workload_dir` last
    checkpointed: the marker's time, else the newest checkpoint file's; None when there is
    no checkpoint directory or nothing in it. Never later than `now`."""
    try:
        outer = os.open(workload_dir, _DIRECTORY)
    except OSError:
        return None
    try:
        inner = os.open(CHECKPOINTS, _DIRECTORY, dir_fd=outer)
    except OSError:
        return None
    finally:
        os.close(outer)
    try:
        found = _marker(inner)
        if found is None:
            found = _newest_file(inner)
    finally:
        os.close(inner)
    return None if found is None else min(found, now)


def _marker(folder: int) -> float | None:
    try:
        info = os.stat(MARKER, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return None
    return info.st_mtime if stat.S_ISREG(info.st_mode) else None


def _newest_file(folder: int) -> float | None:
    newest: float | None = None
    budget = [MAX_ENTRIES]
    for entry in _entries(folder, budget):
        info = _lstat(entry)
        if info is None:
            continue
        if stat.S_ISREG(info.st_mode):
            if _counts(entry.name):
                newest = info.st_mtime if newest is None else max(newest, info.st_mtime)
        elif stat.S_ISDIR(info.st_mode) and not entry.name.startswith("."):
            below = _newest_below(folder, entry.name, budget)
            if below is not None:
                newest = below if newest is None else max(newest, below)
    return newest


def _newest_below(folder: int, name: str, budget: list[int]) -> float | None:
    """The newest regular file directly in the subdirectory `name` (not followed if it
    became a symlink since it was listed)."""
    try:
        sub = os.open(name, _DIRECTORY, dir_fd=folder)
    except OSError:
        return None
    newest: float | None = None
    try:
        for entry in _entries(sub, budget):
            info = _lstat(entry)
            if info is not None and stat.S_ISREG(info.st_mode) and _counts(entry.name):
                newest = info.st_mtime if newest is None else max(newest, info.st_mtime)
    finally:
        os.close(sub)
    return newest


def _entries(folder: int, budget: list[int]) -> Iterator[os.DirEntry[str]]:
    """The entries of an open directory while the shared budget lasts."""
    with contextlib.suppress(OSError), os.scandir(folder) as listing:
        for entry in listing:
            if budget[0] <= 0:
                return
            budget[0] -= 1
            yield entry


def _lstat(entry: os.DirEntry[str]) -> os.stat_result | None:
    try:
        return entry.stat(follow_symlinks=False)
    except OSError:
        return None


def _counts(name: str) -> bool:
    """Whether a file's time may be a checkpoint's: not hidden, not one being written."""
    return not name.startswith(".") and not name.endswith(".tmp")
