"""A task's log, bounded: at most a cap of its newest output is kept on disk.

The command writes into a pipe; its launcher copies the pipe into the log (`CappedLog`),
so that a task printing without end cannot fill the data directory. Past the cap, the
oldest output is dropped by punching a hole in the file (FALLOC_FL_PUNCH_HOLE): the
file's blocks stay within the cap while its offsets never move, so `corral logs -f` and
the log shipping of Ray agents, which both go on from an offset, go on. Readers skip
the hole (`read_kept`) and print a marker line in its place. On a file system that
cannot punch holes the newest output is dropped instead, after one marker line.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path
from typing import BinaryIO

# Every task's launcher imports this module: it imports nothing of corral.model.
DEFAULT_LOG_CAP = 1 << 30
# Less would drop output at every line; the CLI refuses it.
MIN_LOG_CAP = 64 << 10
BLOCK = 4096
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


def marker(dropped: int) -> bytes:
    """The line that stands for `dropped` bytes of output no longer kept."""
    return f"[corral: {dropped} bytes of older output were dropped: the log is capped]\n".encode()


def write_note(path: Path, what: str) -> None:
    """Append corral's own line `[corral: what]` to the log at `path` (made 0600 if new;
    never through a symlink), before the task's output: what its agent did for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, f"[corral: {what}]\n".encode())
    finally:
        os.close(fd)


class CappedLog:
    """Appends to the log open as `fd` (O_APPEND), keeping at most `cap` bytes on disk:
    once over, the oldest part goes, down to half the cap, so that holes are punched
    seldom and in large pieces."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd = fd
        self.cap = cap
        self.size = os.fstat(fd).st_size
        # Earlier runs of the task appended to the same log, and may have dropped some.
        self.kept_from = _data_start(fd, 0) or 0
        # Set when holes cannot be punched and the cap is reached: the rest is dropped.
        self.full = False

    def write(self, data: bytes) -> None:
        """Append `data`; output that cannot be written (a full disk) is dropped, never
        the launcher."""
        if self.full:
            return
        view = memoryview(data)
        try:
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
                self.size += written
        except OSError:
            return
        if self.size - self.kept_from > self.cap:
            self._drop()

    def _drop(self) -> None:
        # The launcher's own lines reach the file too: the size comes from the file.
        self.size = os.fstat(self.fd).st_size
        kept_from = keep_newest(self.fd, self.size, self.cap)
        if kept_from is None:
            self.full = True
            note = f"[corral: the log reached its cap of {self.cap} bytes: later output is dropped]"
            os.write(self.fd, f"{note}\n".encode())
            return
        self.kept_from = kept_from


def keep_newest(fd: int, size: int, cap: int) -> int | None:
    """Drop the oldest output of the log `fd` of `size` bytes, keeping about half of `cap`
    of the newest (from a block's start on); where it now begins, or None when this file
    system cannot punch holes."""
    kept_from = (size - cap // 2) // BLOCK * BLOCK
    try:
        _punch(fd, kept_from)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        return None
    return kept_from


def over_cap(fd: int, size: int, cap: int) -> bool:
    """Whether the log `fd` of `size` bytes keeps more than `cap` of them on disk."""
    start = _data_start(fd, 0)
    return start is not None and size - start > cap


def _punch(fd: int, length: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    if libc.fallocate(fd, mode, 0, length) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _data_start(fd: int, offset: int) -> int | None:
    """Where output is kept at or after `offset`; None when there is none."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as error:
        if error.errno == errno.ENXIO:
            return None
        raise


def read_kept(handle: BinaryIO, offset: int, limit: int) -> tuple[int, bytes]:
    """Up to `limit` bytes of a log from `offset`, with how many bytes before them were
    dropped (a hole skipped; 0 when none). The next read goes on from `offset` plus both."""
    fd = handle.fileno()
    start = _data_start(fd, offset)
    if start is None:
        return 0, b""
    end = os.lseek(fd, start, os.SEEK_HOLE)
    handle.seek(start)
    return start - offset, handle.read(min(limit, end - start))
