"""Reading and writing an exec session's non-blocking fds from an asyncio event loop,
one chunk at a time, waiting on the loop (no thread per stream). Used by the server's
exec bridge (sessions of in-process agents) and by the relay of a Ray node's agent."""

from __future__ import annotations

import asyncio
import errno
import os

CHUNK = 64 * 1024


async def read_fd(fd: int, size: int = CHUNK) -> bytes:
    """Up to `size` bytes from a non-blocking fd, waiting on the event loop; b"" at its
    end (a terminal whose last process is gone reads EIO)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return os.read(fd, size)
        except BlockingIOError:
            pass
        except OSError as error:
            if error.errno in (errno.EIO, errno.EBADF):
                return b""
            raise
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


async def write_fd(fd: int, data: bytes) -> None:
    """All of `data` to a non-blocking fd, waiting on the event loop when it is full."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
            continue
        except BlockingIOError:
            pass
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_writer(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_writer(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
