"""A gang whose ranks depend on each other as collective libraries make them (gloo, NCCL,
MPI): rank 0 listens on MASTER_PORT, the others connect, and every 100 ms rank 0 sends a
step to each peer and waits for it back. A rank exits 1 as soon as a peer's connection
drops or stalls, as real ranks do when a peer vanishes. Every rank checkpoints its step
to CORRAL_CHECKPOINT_DIR every 10 steps and resumes from there.

    python ranks.py RECORDS STOP_FILE

Each (rank, attempt) keeps RECORDS/<workload>-<rank>-<attempt>.json up to date: its run,
the step it resumed from, the last step it checkpointed and the one it is checkpointing.
When STOP_FILE exists, rank 0 tells the others, and every rank exits 0.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

STEP = struct.Struct("!q")
DONE = -1
# A peer that does not answer within this long is gone (gloo's default is minutes; the
# tests want the rank to notice a vanished peer as a real one would, only sooner).
STALL = 20.0


def main(records: str, stop_file: str) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    folder = os.environ["CORRAL_CHECKPOINT_DIR"]
    os.makedirs(folder, exist_ok=True)
    checkpoint = os.path.join(folder, f"rank-{rank}.json")
    step = _read(checkpoint).get("step", 0)
    name = os.environ["CORRAL_WORKLOAD"]
    # Which run of the rank this is: its pid is its namespace's (docs/security.md).
    record = {"run": os.urandom(8).hex(), "rank": rank, "start": step, "checkpoint": step}
    path = os.path.join(records, f"{name}-{rank}-{os.environ['CORRAL_ATTEMPT']}.json")
    _write(path, record)
    peers = _connect(rank, world)
    print(f"[ranks] rank={rank} resumes at step {step}", flush=True)
    while True:
        time.sleep(0.1)
        stop = rank == 0 and os.path.exists(stop_file)
        try:
            if not _exchange(rank, peers, DONE if stop else step):
                break
        except (OSError, ValueError) as error:
            print(f"[ranks] rank={rank} lost a peer at step {step}: {error}", flush=True)
            return 1
        if stop:
            break
        step += 1
        if step % 10 == 0:
            # A rank killed between the two writes resumes at either step: the record
            # names both, the one being written and the last one written.
            record["checkpointing"] = step
            _write(path, record)
            _write(checkpoint, {"step": step})
            record["checkpoint"] = step
            _write(path, record)
            print(f"[ranks] rank={rank} step={step}", flush=True)
    print(f"[ranks] rank={rank} done at step {step}", flush=True)
    return 0


def _connect(rank: int, world: int) -> list[socket.socket]:
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if rank == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(address)
        server.listen()
        server.settimeout(120)
        peers = [server.accept()[0] for _ in range(world - 1)]
        server.close()
    else:
        deadline = time.time() + 120
        while True:
            try:
                peers = [socket.create_connection(address, timeout=5)]
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
    for peer in peers:
        peer.settimeout(STALL)
    return peers


def _exchange(rank: int, peers: list[socket.socket], step: int) -> bool:
    """One collective: rank 0 sends `step`, each peer sends it back. False once rank 0
    said that the run is over."""
    if rank == 0:
        for peer in peers:
            peer.sendall(STEP.pack(step))
        for peer in peers:
            if _receive(peer) != step:
                raise ValueError("a peer answered another step")
        return True
    (peer,) = peers
    got = _receive(peer)
    peer.sendall(STEP.pack(got))
    return got != DONE


def _receive(peer: socket.socket) -> int:
    data = b""
    while len(data) < STEP.size:
        more = peer.recv(STEP.size - len(data))
        if not more:
            raise ConnectionResetError("the connection was closed by the peer")
        data += more
    value: int = STEP.unpack(data)[0]
    return value


def _read(path: str) -> dict[str, int]:
    try:
        with open(path) as handle:
            found: dict[str, int] = json.load(handle)
            return found
    except (OSError, ValueError):
        return {}


def _write(path: str, value: dict[str, int]) -> None:
    # Whole or not at all: the test and the next attempt read it while this one writes.
    with open(path + ".tmp", "w") as handle:
        json.dump(value, handle)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
