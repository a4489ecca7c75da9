"""An exec session's own fds and its end: what `corral exec` relies on, one session beside
another."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from corral.agent.exec import ExecSession, spawn


def session(tmp_path: Path, script: str) -> ExecSession:
    return spawn("w", ["/bin/sh", "-c", script], dict(os.environ), str(tmp_path), None, False)


def take_number(number: int) -> list[int]:
    """Open fds until one has `number` (a free one), as another session's stream or a
    client's socket opened next would; returns them all, `number`'s last."""
    taken = [os.dup(2)]
    while taken[-1] != number:
        assert len(taken) <= number + 1, f"fd {number} was not free"
        taken.append(os.dup(2))
    return taken


def test_a_released_session_leaves_alone_what_took_the_number_of_its_ended_input(
    tmp_path: Path,
) -> None:
    """The client ends the input (`{"eof": true}`), which closes it; the number is free
    and the next fd opened takes it. Releasing the session must not close that fd too:
    it belonged to another member's session, or to a client's connection."""
    ended = session(tmp_path, "cat >/dev/null")
    number = ended.input
    ended.end_input()
    taken = take_number(number)
    try:
        ended.release()
        os.fstat(number)  # OSError (EBADF) if the release closed it again
        ended.control('{"eof": true}')  # ending it again closes nothing either
        os.fstat(number)
    finally:
        for fd in taken:
            os.close(fd)


def test_the_exit_of_a_command_that_closed_its_output_is_awaited_without_a_thread(
    tmp_path: Path,
) -> None:
    lingering = session(tmp_path, "exec >&- 2>&-; sleep 0.5; exit 7")
    threads = len(os.listdir("/proc/self/task"))

    async def main() -> tuple[int | None, int]:
        gone = asyncio.get_running_loop().create_future()  # the client stays
        waiting = asyncio.ensure_future(lingering.exited(gone))
        await asyncio.sleep(0.1)
        return await waiting, len(os.listdir("/proc/self/task"))

    try:
        started = time.monotonic()
        code, threads_meanwhile = asyncio.run(main())
        assert code == 7
        assert time.monotonic() - started >= 0.4
        assert threads_meanwhile == threads
    finally:
        lingering.release()


@pytest.mark.parametrize("signal_number", [9, 15])
def test_a_command_killed_by_a_signal_exits_128_plus_its_number(
    tmp_path: Path, signal_number: int
) -> None:
    killed = session(tmp_path, f"kill -{signal_number} $$")

    async def main() -> int | None:
        return await killed.exited(asyncio.get_running_loop().create_future())

    try:
        assert asyncio.run(main()) == 128 + signal_number
    finally:
        killed.release()


def test_the_wait_for_an_exit_ends_when_the_client_goes_away(tmp_path: Path) -> None:
    lingering = session(tmp_path, "exec >&- 2>&-; sleep 30")

    async def main() -> int | None:
        gone = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.2, gone.set_result, None)
        return await asyncio.wait_for(lingering.exited(gone), 5)

    try:
        assert asyncio.run(main()) is None
        assert lingering.process.poll() is None  # the caller releases it (kills it)
    finally:
        lingering.release()
    assert lingering.process.poll() is not None
