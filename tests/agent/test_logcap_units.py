"""corral.agent.logcap on real files: a log keeps at most its cap on disk, its oldest
output dropped as a hole that keeps every offset, and each reader (`corral logs`, the log
shipping of Ray agents) skips the hole with a marker line in its place."""

from __future__ import annotations

import os
from pathlib import Path

from corral.agent.logcap import CappedLog, read_kept
from corral.api.logs import read_log
from corral.cluster.log_shipping import Inbox, Outbox
from corral.model import TaskGroup
from corral.model.spec import WorkloadSpec
from corral.store.records import WorkloadRecord

CAP = 256 << 10
CHUNK = 64 << 10


def fill(path: Path, lines: range, cap: int = CAP) -> None:
    """Lines "line N", numbered, through a capped log as a launcher writes them."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        log = CappedLog(fd, cap)
        batch: list[bytes] = []
        for number in lines:
            batch.append(f"line {number:08d}\n".encode())
            if len(batch) * 14 >= CHUNK:
                log.write(b"".join(batch))
                batch.clear()
        log.write(b"".join(batch))
    finally:
        os.close(fd)


def test_only_the_newest_output_is_kept_on_disk_and_offsets_never_move(tmp_path: Path) -> None:
    path = tmp_path / "task-0.log"
    fill(path, range(300_000))  # 4.2 MB through a 256 KiB cap
    size = path.stat().st_size
    assert size == 300_000 * 14  # every offset is where it was
    assert path.stat().st_blocks * 512 <= CAP + CHUNK
    with open(path, "rb") as handle:
        dropped, data = read_kept(handle, 0, 1 << 30)
    assert CAP // 2 <= size - dropped <= CAP + CHUNK
    assert data.endswith(b"line 00299999\n")
    # The drop falls on a block, not on a line: what is kept begins with a piece of one.
    assert data[dropped % 14 and 14 - dropped % 14 :].startswith(b"line ")
    # The next run of the task appends to the same log, and knows what was dropped.
    fill(path, range(300_000, 310_000))
    assert path.stat().st_blocks * 512 <= CAP + CHUNK
    with open(path, "rb") as handle:
        assert read_kept(handle, size, 14) == (0, b"line 00300000\n")


def test_corral_logs_reads_a_marker_for_what_was_dropped_and_follows_on(tmp_path: Path) -> None:
    spec = WorkloadSpec("chatty", "p", "u", (TaskGroup(),))
    workload = WorkloadRecord(1, spec, "running", None, 1, 0.0, 0.0, None, ())
    folder = tmp_path / "logs" / workload.directory
    folder.mkdir(parents=True)
    fill(folder / "task-0.log", range(100_000))
    first = read_log(tmp_path, workload, 0, 0, None)
    marker, rest = first.text.split("\n", 1)
    assert marker.startswith("[corral: ") and "bytes of older output were dropped" in marker
    dropped = int(marker.split()[1])
    assert first.offset == dropped + len(rest.encode())
    followed = first.text
    offset = first.offset
    while (more := read_log(tmp_path, workload, 0, offset, None)).text:
        followed += more.text
        offset = more.offset
    assert offset == 100_000 * 14 and followed.endswith("line 00099999\n")
    assert read_log(tmp_path, workload, 0, 0, 2).text == "line 00099998\nline 00099999\n"


def test_a_node_ships_a_marker_for_what_it_dropped_before_shipping(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    sender = Outbox(node / "offsets.json", lambda w, t: node / f"{w}-{t}.log")
    receiver = Inbox(tmp_path / "server")
    sender.watch(("job", 0))
    # The server was away while the task wrote four caps of output.
    fill(node / "job-0.log", range(100_000))
    stored = b""
    while chunks := sender.chunks():
        receipt = {(w, t): receiver.take("a", w, t, o, data) for w, t, o, data in chunks}
        sender.acknowledge(receipt)
        stored = receiver.path("job", 0).read_bytes()
    assert stored.startswith(b"[corral: ") and b"bytes of older output were dropped" in stored
    assert stored.endswith(b"line 00099999\n")
    assert len(stored) < CAP + CHUNK + 200


def test_the_server_keeps_a_shipped_log_within_the_cap_too(tmp_path: Path) -> None:
    """Under Ray the server stores what every node ships: it drops the oldest as the
    agents do, and its index (offsets and sizes) is as it would be without."""
    node = tmp_path / "node"
    node.mkdir()
    sender = Outbox(node / "offsets.json", lambda w, t: node / f"{w}-{t}.log")
    receiver = Inbox(tmp_path / "server" / "logs", CAP)
    sender.watch(("job.1", 0))
    for start in range(0, 100_000, 5_000):
        with open(node / "job.1-0.log", "ab") as handle:
            handle.write(b"".join(f"line {n:08d}\n".encode() for n in range(start, start + 5_000)))
        while chunks := sender.chunks():
            sender.acknowledge({(w, t): receiver.take("a", w, t, o, d) for w, t, o, d in chunks})
    stored = receiver.path("job.1", 0)
    assert stored.stat().st_size == 100_000 * 14
    assert stored.stat().st_blocks * 512 <= CAP + (1 << 20)  # one shipped chunk over at most
    workload = WorkloadRecord(
        1, WorkloadSpec("job", "p", "u", (TaskGroup(),)), "running", None, 1, 0.0, 0.0, None, ()
    )
    assert read_log(tmp_path / "server", workload, 0, 0, 1).text == "line 00099999\n"
