"""The node's cache of code snapshots: each digest unpacked once, and every task given a
private writable copy of it.

Walls: the cache is shared by every project on the node, so its root is 0700 and the
agent's own; no task account may read it, or one project's task could read another's
code. A task gets instead a copy owned by its account, made without following anything
the account could have planted at or under the copy's place.

Unpacking happens once per node however many tasks (threads or processes) ask at once:
a file lock per digest makes the later callers wait for the first and reuse its tree.
The bytes are verified against their digest and checked (`corral.spec.snapshots.check`)
before tarfile's "data" filter extracts them into a scratch directory, which is renamed
into place with its record only when whole: a crash leaves scratch, never a tree that
looks done. The record's time is the tree's last use, by which `prune` removes the
least recently used trees once they hold more than the cap.

Layout under the root: trees/HEX/{tree/, record}, work/ (scratch), locks/HEX.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import re
import secrets
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from corral.agent.filelocks import try_lock
from corral.agent.planted import own_directory
from corral.spec.snapshots import check

DEFAULT_CACHE_CAP = 10 * 1024**3
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
# Written last into a tree's directory: its content size; its mtime is the last use.
_RECORD = "record"
_TREE = "tree"
_CHUNK = 1024 * 1024
# Tries at putting a copy in place when something keeps taking its name.
_PLACE_TRIES = 5


class SnapshotCache:
    """Unpacked snapshots under `root`, each once, pruned beyond `cap_bytes` of content.

    An archive holding more than `max_unpacked` bytes (by default `cap_bytes`: a tree the
    cache cannot hold) is refused before it is unpacked."""

    def __init__(
        self, root: Path, cap_bytes: int = DEFAULT_CACHE_CAP, *, max_unpacked: int | None = None
    ) -> None:
        own_directory(root, 0o700, "the snapshot cache")
        self.root, self.cap_bytes = root, cap_bytes
        self.max_unpacked = cap_bytes if max_unpacked is None else max_unpacked
        self._trees, self._work, self._locks = root / "trees", root / "work", root / "locks"
        for folder in (self._trees, self._work, self._locks):
            folder.mkdir(mode=0o700, exist_ok=True)

    def ensure(self, digest: str, fetch: Callable[[], bytes]) -> Path:
        """The unpacked tree of `digest` ("sha256:" and 64 hex digits), calling `fetch` for
        its .tar.gz only when no caller on this node has unpacked it yet.

        Raises ValueError when the digest is malformed, when the fetched bytes have
        another digest, or when `check` refuses them; nothing is left in the cache then."""
        key = _key(digest)
        home = self._trees / key
        with self._lock(key, fcntl.LOCK_EX):
            if not (home / _RECORD).is_file():
                self._discard(key)
                self._unpack(key, digest, fetch())
            # The clock's own nanoseconds: the kernel's file times are as coarse as a tick,
            # which would tie uses made in quick succession.
            now = time.time_ns()
            os.utime(home / _RECORD, ns=(now, now))
        return home / _TREE

    def _unpack(self, key: str, digest: str, data: bytes) -> None:
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise ValueError(f"the bytes fetched for {digest} have the digest {actual}")
        info = check(io.BytesIO(data), self.max_unpacked)
        scratch = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=self._work))
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
                archive.extractall(scratch / _TREE, filter="data")
            (scratch / _RECORD).write_text(f"{info.size}\n")
            os.rename(scratch, self._trees / key)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def _discard(self, key: str) -> None:
        """Remove what is left of `key` (a tree without its record, scratch of a crashed
        unpacking); the caller holds its lock. A tree is first renamed out of its place, so
        that a crash while removing it leaves scratch, not a tree missing files."""
        home = self._trees / key
        if home.exists():
            os.rename(home, self._work / f"{key}.gone.{secrets.token_hex(4)}")
        for leftover in self._work.glob(f"{key}.*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def prune(self) -> tuple[str, ...]:
        """Remove the least recently used trees until the rest hold at most `cap_bytes`,
        and scratch left by crashes; the digests removed. A digest whose lock is held (an
        `ensure` or a `working_copy` in progress) is passed over."""
        found: list[tuple[int, str, int]] = []
        for home in self._trees.iterdir():
            try:
                record = home / _RECORD
                found.append((record.stat().st_mtime_ns, home.name, int(record.read_text())))
            except (OSError, ValueError):
                continue  # being made or left half-made: ensure redoes it
        total = sum(size for _, _, size in found)
        removed: list[str] = []
        for used, key, size in sorted(found):
            if total <= self.cap_bytes:
                break
            with self._try_lock(key) as held:
                record = self._trees / key / _RECORD
                if not held or not record.exists() or record.stat().st_mtime_ns != used:
                    continue  # in use, or used since the listing
                self._discard(key)
            total -= size
            removed.append(f"sha256:{key}")
        for leftover in {path.name.split(".")[0] for path in self._work.iterdir()}:
            with self._try_lock(leftover) as held:
                if held:
                    for path in self._work.glob(f"{leftover}.*"):
                        shutil.rmtree(path, ignore_errors=True)
        return tuple(removed)

    def working_copy(self, tree: Path, destination: Path, uid: int | None, gid: int | None) -> None:
        """Make `destination` a private writable copy of `tree` (from `ensure`), owned by
        `uid`/`gid` when given, replacing whatever was there. Symlinks stay symlinks.

        Nothing at or under `destination` is followed: the copy is made in a fresh 0700
        directory beside it, through descriptors, and renamed into place; what was there
        is removed by name (a symlink itself, a directory without following links in it).
        The parent of `destination` is trusted: it is the agent's to make."""
        key = tree.parent.name if tree.parent.parent == self._trees else None
        holding = self._lock(key, fcntl.LOCK_SH) if key else contextlib.nullcontext()
        parent = os.open(destination.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with holding:
                staging = f".{destination.name}.{secrets.token_hex(6)}"
                os.mkdir(staging, 0o700, dir_fd=parent)
                try:
                    top = _open_own_directory(staging, parent)
                    try:
                        _copy_into(tree, top, uid, gid)
                        _own(top, uid, gid, 0o700)
                    finally:
                        os.close(top)
                    _put_in_place(parent, staging, destination.name)
                except BaseException:
                    _remove(parent, staging)
                    raise
        finally:
            os.close(parent)

    @contextlib.contextmanager
    def _lock(self, key: str, kind: int) -> Iterator[None]:
        """flock on the digest's lock file: one open file each, so that threads of one
        process exclude each other as processes do. Lock files are never removed, since a
        waiter on a removed one would exclude nobody."""
        fd = os.open(self._locks / key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, kind)
            yield
        finally:
            os.close(fd)

    def _try_lock(self, key: str) -> contextlib.AbstractContextManager[bool]:
        return try_lock(self._locks / key)


def _key(digest: str) -> str:
    """The hex part of `digest`, which names files: anything else is refused."""
    match = _DIGEST.fullmatch(digest)
    if match is None:
        raise ValueError(f"digest {digest!r} is not 'sha256:' and 64 lowercase hex digits")
    return match.group(1)


def _open_own_directory(name: str, parent: int) -> int:
    """A descriptor of the directory `name` just made in `parent`, refused when another
    account has put something else under that name since."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{name} was replaced by another account's directory")
    return fd


def _own(fd: int, uid: int | None, gid: int | None, mode: int) -> None:
    if uid is not None or gid is not None:
        os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
    os.fchmod(fd, mode)


def _copy_into(source: Path, target: int, uid: int | None, gid: int | None) -> None:
    """Copy the directory `source`'s entries into the directory open as `target`: files
    0600 (0700 when executable), directories 0700, symlinks as they are."""
    with os.scandir(source) as scan:
        items = sorted(scan, key=lambda item: item.name)
    for item in items:
        info = item.stat(follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(item.path), item.name, dir_fd=target)
            if uid is not None or gid is not None:
                os.chown(
                    item.name,
                    -1 if uid is None else uid,
                    -1 if gid is None else gid,
                    dir_fd=target,
                    follow_symlinks=False,
                )
        elif stat.S_ISDIR(info.st_mode):
            os.mkdir(item.name, 0o700, dir_fd=target)
            inner = _open_own_directory(item.name, target)
            try:
                _copy_into(Path(item.path), inner, uid, gid)
                _own(inner, uid, gid, 0o700)
            finally:
                os.close(inner)
        elif stat.S_ISREG(info.st_mode):
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(item.name, flags, 0o600, dir_fd=target)
            with open(item.path, "rb") as reader, os.fdopen(out, "wb") as writer:
                shutil.copyfileobj(reader, writer, _CHUNK)
                writer.flush()
                _own(out, uid, gid, 0o700 if info.st_mode & 0o100 else 0o600)
        else:
            raise ValueError(f"{item.path} is not a file, directory or symlink")


def _put_in_place(parent: int, staging: str, name: str) -> None:
    """Rename `staging` to `name` in `parent`, removing what is there first. rename never
    follows a symlink at its target, and fails on anything but an empty directory, so a
    name taken again between the removal and the rename is removed again."""
    for _ in range(_PLACE_TRIES):
        _remove(parent, name)
        try:
            os.rename(staging, name, src_dir_fd=parent, dst_dir_fd=parent)
            return
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise
    raise FileExistsError(f"{name}: something kept taking its place while the copy was made")


def _remove(parent: int, name: str) -> None:
    """Remove `name` in `parent` without following it or any symlink under it."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        # With dir_fd, rmtree works through descriptors and never follows a symlink.
        shutil.rmtree(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)
