"""The exec relay's cost (corral.cluster.exec_relay, how `corral exec` reaches a Ray node):
throughput and round-trip latency of a session's streams through the relay, against
reading the same session's fds directly (the path of an agent in the server's process).

    python benchmarks/exec_relay.py [--json] [--size MIB] [--echoes N]

1. Throughput: `head -c SIZE MiB /dev/zero` (256 MiB by default), read to its end, in
   MB/s (10^6 bytes per second); the best of 3 rounds.
2. Round trip: `cat`, N lines (500 by default) written one at a time, each read back
   before the next; the median and 99th percentile, in milliseconds.

Relay and reader share one machine (and the relay's loop runs in this process, as in an
agent): the figures include both ends. With --json the last line is one JSON object:
`direct_mb_s`, `relay_mb_s`, `direct_p50_ms`, `direct_p99_ms`, `relay_p50_ms`,
`relay_p99_ms`, `size_mib`, `echoes`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from typing import Any

from corral.agent.exec import ExecSession, spawn
from corral.agent.fdio import read_fd, write_fd
from corral.cluster.exec_relay import EXIT, IN, OK, OUT, SessionRelay, frame, read_frame


def start(*command: str) -> ExecSession:
    env = {"PATH": os.environ["PATH"]}
    return spawn("bench", list(command), env, tempfile.gettempdir(), None, False)


async def direct_bytes(session: ExecSession) -> int:
    total = 0
    while data := await read_fd(session.output):
        total += len(data)
    return total


async def relay_bytes(relay: SessionRelay, session: ExecSession) -> int:
    reader, writer = await claim(relay, session)
    total = 0
    while True:
        kind, data = await read_frame(reader)
        if kind == OUT:
            total += len(data)
        elif kind == EXIT:
            break
    writer.close()
    return total


async def claim(
    relay: SessionRelay, session: ExecSession
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    ticket = relay.offer(session)
    reader, writer = await asyncio.open_connection(ticket.host, ticket.port, limit=1 << 21)
    writer.write(ticket.secret)
    assert (await read_frame(reader))[0] == OK
    return reader, writer


async def direct_echoes(session: ExecSession, count: int) -> list[float]:
    times = []
    for _ in range(count):
        begin = time.perf_counter()
        await write_fd(session.input, b"x\n")
        await read_fd(session.output)
        times.append(time.perf_counter() - begin)
    return times


async def relay_echoes(relay: SessionRelay, session: ExecSession, count: int) -> list[float]:
    reader, writer = await claim(relay, session)
    times = []
    for _ in range(count):
        begin = time.perf_counter()
        writer.write(frame(IN, b"x\n"))
        await writer.drain()
        await read_frame(reader)
        times.append(time.perf_counter() - begin)
    writer.close()
    return times


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


async def measure(size: int, echoes: int) -> dict[str, Any]:
    relay = SessionRelay("127.0.0.1", lambda session: None)
    sessions: list[ExecSession] = []
    try:
        rates: dict[str, float] = {"direct": 0.0, "relay": 0.0}
        for _ in range(3):
            for way in ("direct", "relay"):
                session = start("head", "-c", str(size << 20), "/dev/zero")
                sessions.append(session)
                begin = time.perf_counter()
                total = await (
                    direct_bytes(session) if way == "direct" else relay_bytes(relay, session)
                )
                assert total == size << 20, total
                rates[way] = max(rates[way], total / (time.perf_counter() - begin) / 1e6)
        session = start("cat")
        sessions.append(session)
        direct = await direct_echoes(session, echoes)
        session = start("cat")
        sessions.append(session)
        relayed = await relay_echoes(relay, session, echoes)
    finally:
        for session in sessions:
            session.release()
        relay.close()
    return {
        "direct_mb_s": round(rates["direct"], 1),
        "relay_mb_s": round(rates["relay"], 1),
        "direct_p50_ms": round(statistics.median(direct) * 1000, 3),
        "direct_p99_ms": round(p(direct, 0.99), 3),
        "relay_p50_ms": round(statistics.median(relayed) * 1000, 3),
        "relay_p99_ms": round(p(relayed, 0.99), 3),
        "size_mib": size,
        "echoes": echoes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--size", type=int, default=256, help="MiB read per round")
    parser.add_argument("--echoes", type=int, default=500)
    args = parser.parse_args()
    found = asyncio.run(measure(args.size, args.echoes))
    print(f"throughput: direct {found['direct_mb_s']} MB/s, relay {found['relay_mb_s']} MB/s")
    print(
        f"round trip p50/p99: direct {found['direct_p50_ms']}/{found['direct_p99_ms']} ms, "
        f"relay {found['relay_p50_ms']}/{found['relay_p99_ms']} ms"
    )
    if args.json:
        print(json.dumps(found))


if __name__ == "__main__":
    main()
