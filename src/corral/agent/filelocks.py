"""File locks (flock) of the node's caches, which threads and processes alike wait on:
each holder opens the lock file for itself, so that two threads of one process exclude
each other as two processes do. Lock files are never removed, since a waiter on a
removed one would exclude nobody."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def try_lock(path: Path) -> Iterator[bool]:
    """Hold the lock of `path` if nobody does; yields whether it is held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)
