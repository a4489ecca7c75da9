"""Task logs from the nodes to the server: sent at least once, stored exactly once.

A node's agent writes each task's output to a file on its own disk, and ships it to the
server in its answers (corral.cluster.ray_agent). Either side may die at any moment: the
server between receiving a chunk and storing it, the agent between reading a chunk and
hearing that it was stored. So:

- The agent (`Outbox`) sends every chunk from the offset the server last acknowledged,
  again and again until an acknowledgement comes, and keeps those offsets in a file of
  its own, so that an agent restarted by Ray goes on where the server stands.
- The server (`Inbox`) stores a chunk only past what it already has from that node, and
  records after each write, in an index beside the log (`task-N.log.idx`, one line per
  write: node, the node's offset, the log's size), how far it got. Bytes past the last
  recorded size (a write the server was killed in the middle of) are cut off when the
  index is read again, and come again from the node, whose offset was not acknowledged.

Logs are kept by the name of their workload's directories (NAME.ID: corral.model.spec.
directory_name), not by the workload's name, so that a later workload of the same name
starts with none of a deleted one's output. A deleted workload's log is forgotten on both
sides (`forget`): the agent ships no more of it, and the server drops what still comes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.agent.logcap import keep_newest, marker, over_cap, read_kept
from corral.model.spec import is_directory_name

Key = tuple[str, int]  # (the name of its workload's directories, task)
# At most this much of one task's log per answer; the rest follows in the next ones.
CHUNK = 1 << 20
# Index states the server keeps in memory (one per task log written lately), and deleted
# workloads whose late chunks it drops.
CACHED = 10_000


class Outbox:
    """The agent's side: what of each task's log the server acknowledged."""

    def __init__(self, state_file: Path, path_of: Callable[[str, int], Path]) -> None:
        self.state_file = state_file
        self.path_of = path_of
        self.offsets: dict[Key, int] = {}
        # Tasks whose log is complete: forgotten once acknowledged to its end.
        self.ended: set[Key] = set()
        with contextlib.suppress(OSError, ValueError, TypeError):
            for workload, task, offset, ended in json.loads(state_file.read_text()):
                key = (str(workload), int(task))
                self.offsets[key] = int(offset)
                if ended:
                    self.ended.add(key)

    def watch(self, key: Key) -> None:
        """A task starts here: ship its log from where the server stands; for a log this
        node never shipped (or forgot once it was acknowledged to its end), from its end,
        since an earlier attempt's output in it reached the server already."""
        if key not in self.offsets:
            path = self.path_of(*key)
            self.offsets[key] = path.stat().st_size if path.exists() else 0
            self._save()
        self.ended.discard(key)

    def finish(self, key: Key) -> None:
        """The task ended: its log grows no more."""
        if key in self.offsets and key not in self.ended:
            self.ended.add(key)
            self._save()

    def forget(self, directory: str) -> None:
        """The workload whose directories are named so was deleted: ship no more of its
        logs."""
        keys = [key for key in self.offsets if key[0] == directory]
        for key in keys:
            del self.offsets[key]
            self.ended.discard(key)
        if keys:
            self._save()

    def acknowledge(self, stored: Mapping[Key, int]) -> None:
        """The server stored these logs up to these offsets."""
        changed = False
        for key, offset in stored.items():
            if key in self.offsets and offset > self.offsets[key]:
                self.offsets[key] = offset
                changed = True
        if changed:
            self._save()

    def chunks(self) -> list[tuple[str, int, int, bytes]]:
        """What the server has not acknowledged yet, as (directory, task, offset, bytes),
        at most CHUNK per task; forgets the logs acknowledged to the end of a task."""
        found = []
        forgotten = False
        for key, offset in list(self.offsets.items()):
            try:
                with open(self.path_of(*key), "rb") as handle:
                    dropped, data = read_kept(handle, offset, CHUNK)
            except OSError:
                dropped, data = 0, b""
            if data:
                found.append((key[0], key[1], *_past(offset, dropped, data)))
            elif key in self.ended:
                del self.offsets[key]
                self.ended.discard(key)
                forgotten = True
        if forgotten:
            self._save()
        return found

    def _save(self) -> None:
        state = [[w, t, offset, (w, t) in self.ended] for (w, t), offset in self.offsets.items()]
        temporary = self.state_file.with_name(self.state_file.name + ".tmp")
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self.state_file)


@dataclass(slots=True)
class _Stored:
    """How far a task's log on the server got: its size, and each node's offset in it."""

    size: int = 0
    nodes: dict[str, int] = field(default_factory=dict)


class Inbox:
    """The server's side: task logs under `root` (DATA_DIR/logs), stored exactly once."""

    def __init__(self, root: Path, cap: int | None = None) -> None:
        """`cap`: the most of a task's log kept (corral.agent.logcap), None: all of it."""
        self.root = root
        self.cap = cap
        self._stored: OrderedDict[Key, _Stored] = OrderedDict()
        # Deleted workloads, by the name of their directories: what still comes of their
        # logs (sent before their agent forgot them) is dropped.
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        # A deletion (an API thread) and the storing of chunks (the poller) do not meet
        # halfway: no log is written again into a directory being removed.
        self._lock = threading.Lock()

    def path(self, directory: str, task: int) -> Path:
        return self.root / directory / f"task-{task}.log"

    def take(self, node: str, directory: str, task: int, offset: int | None, data: bytes) -> int:
        """Store what of `data` (found at `offset` in the node's log of the task) is not
        stored yet, and return how far the node's log is stored now. An `offset` of None
        (an agent of an older corral) stores it all. The output of a deleted workload is
        dropped (and said stored, so that the node sends it no more). ValueError for a
        `directory` that is no directory's name."""
        _check(directory)
        with self._lock:
            if directory in self._forgotten:
                return (offset or 0) + len(data)
            return self._store(node, (directory, task), offset, data)

    def _store(self, node: str, key: Key, offset: int | None, data: bytes) -> int:
        stored = self._load(key)
        have = stored.nodes.get(node)
        if offset is not None and have is not None and offset < have:
            data = data[min(have - offset, len(data)) :]
            offset = have
        end = (offset or 0) + len(data)
        if not data:
            return have if have is not None else end
        path = self.path(*key)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
        descriptor = os.open(path, flags, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.seek(stored.size)
            handle.write(data)
            handle.truncate()
            handle.flush()
            stored.size += len(data)
            # Past the cap, as on the node: the oldest goes, and every offset stays.
            if self.cap is not None and over_cap(descriptor, stored.size, self.cap):
                keep_newest(descriptor, stored.size, self.cap)
        if offset is not None:
            stored.nodes[node] = end
        with open(self._index(key), "a") as index:
            index.write(f"{node} {stored.nodes.get(node, -1)} {stored.size}\n")
        return end

    def forget(self, directory: str) -> None:
        """The workload whose directories are named so was deleted: remove its logs, and
        drop what still comes of them."""
        _check(directory)
        with self._lock:
            self._forgotten[directory] = None
            while len(self._forgotten) > CACHED:
                self._forgotten.popitem(last=False)
            for key in [key for key in self._stored if key[0] == directory]:
                del self._stored[key]
            shutil.rmtree(self.root / directory, ignore_errors=True)

    def _index(self, key: Key) -> Path:
        return self.path(*key).with_suffix(".log.idx")

    def _load(self, key: Key) -> _Stored:
        stored = self._stored.get(key)
        if stored is not None:
            self._stored.move_to_end(key)
            return stored
        path = self.path(*key)
        path.parent.mkdir(parents=True, exist_ok=True)
        stored = _read_index(self._index(key), path)
        self._stored[key] = stored
        while len(self._stored) > CACHED:
            self._stored.popitem(last=False)
        return stored


def _past(offset: int, dropped: int, data: bytes) -> tuple[int, bytes]:
    """A chunk found `dropped` bytes past `offset` (what the agent dropped beyond its log
    cap, before it was shipped): it comes with a marker line in their place, at the end
    of the gap, so that the node's offsets still only grow."""
    line = marker(dropped)
    if dropped < len(line):
        return offset + dropped, data
    return offset + dropped - len(line), line + data


def _check(directory: str) -> None:
    # A chunk that names anything else is not stored: it must not name another path.
    if not is_directory_name(directory):
        raise ValueError(f"{directory!r} is not the name of a workload's directories")


def _read_index(index: Path, log: Path) -> _Stored:
    """The state of a task's log, from its index; cuts off what the log holds past the
    last recorded size (a write that was not recorded), and writes the index anew, one
    line per node."""
    stored = _Stored()
    lines: list[str] = []
    with contextlib.suppress(OSError):
        # The last piece has no newline: empty, or a line the server was killed writing.
        lines = index.read_text().split("\n")[:-1]
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 3:
            continue
        try:
            node_offset, size = int(parts[1]), int(parts[2])
        except ValueError:
            continue
        stored.size = size
        if node_offset >= 0:
            stored.nodes[parts[0]] = node_offset
    try:
        actual = log.stat().st_size
    except OSError:
        actual = 0
    if not lines or actual < stored.size:
        # No index (a log of an older server), or a log cut behind our back: it is what
        # it is; go on from its end.
        stored.size = actual
    elif actual > stored.size:
        os.truncate(log, stored.size)
    compact = [f"{node} {offset} {stored.size}\n" for node, offset in stored.nodes.items()]
    temporary = index.with_name(index.name + ".tmp")
    temporary.write_text("".join(compact) or f"- -1 {stored.size}\n")
    os.replace(temporary, index)
    return stored
