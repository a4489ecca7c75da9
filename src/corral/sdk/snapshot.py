"""A workload's code as a content-addressed snapshot: `pack` turns a directory into a
.tar.gz named by its sha256 (the server and the nodes check such an archive without
unpacking it: corral.spec.snapshots).

`corral submit --code DIR` packs DIR on the user's machine; the server stores the bytes
under their digest and every node unpacks a digest once. So the digest must depend on
the tree's content only: entries are sorted and every owner, time and permission that
git does not keep is fixed, so two clones of one repository give one digest.

What is left out follows git (`.gitignore` at any depth, `.git/` itself) and a
`.corralignore` at the root in the same syntax, which has the last word: it may leave
out what git keeps (datasets, checkpoints) or take back what git ignores (`!build/`).
Symlinks are kept only when they stay inside the tree, and special files never travel;
both are named in `Snapshot.skipped` so that the user hears what did not go.

"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pathspec import GitIgnoreSpec

DEFAULT_CAP = 100 * 1024 * 1024
"""The most file content (uncompressed bytes) `pack` takes by default."""
IGNORE_FILE = ".corralignore"
GIT_IGNORE_FILE = ".gitignore"

# 2000-01-01: a fixed time, later than tools' "implausibly old" warnings for the epoch.
_FIXED_MTIME = 946_684_800
_CHUNK = 1024 * 1024
# The five largest files are what a user over the cap needs to see first.
_LARGEST_SHOWN = 5


class SnapshotTooLarge(ValueError):
    """The directory holds more file content than the cap; the message names the largest
    files and how to leave them out."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A packed directory: `data` is the .tar.gz, `digest` is "sha256:" and the hex digest
    of `data`, `files` counts regular files and symlinks, `size` is their content in bytes,
    and `skipped` names (relative, sorted) what was left out that the user did not ask to
    leave out: symlinks out of the tree or dangling, and special files."""

    data: bytes
    digest: str
    files: int
    size: int
    skipped: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Entry:
    """One member to pack: `name` is relative and uses "/"; `target` is a symlink's."""

    name: str
    kind: str  # "dir", "file" or "link"
    size: int = 0
    target: str = ""


@dataclass(frozen=True, slots=True)
class _Rules:
    """The ignore files that apply in one directory: the root's .corralignore, and the
    .gitignore files from the root down, each with its directory (relative, "" at root)."""

    corral: GitIgnoreSpec | None
    git: tuple[tuple[str, GitIgnoreSpec], ...]

    def ignores(self, name: str, is_dir: bool) -> bool:
        """Whether `name` (relative to the root) is left out. As in git, the deepest
        .gitignore with a matching pattern decides, and its last matching pattern."""
        path = f"{name}/" if is_dir else name
        if self.corral is not None:
            decided = _decide(self.corral, path)
            if decided is not None:
                return decided
        for base, spec in reversed(self.git):
            decided = _decide(spec, path[len(base) + 1 :] if base else path)
            if decided is not None:
                return decided
        return False


def _decide(spec: GitIgnoreSpec, path: str) -> bool | None:
    """True when the last pattern of `spec` matching `path` ignores it, False when it is a
    negation, None when none matches (so that a shallower file may decide)."""
    decided = None
    for pattern in spec.patterns:
        if pattern.include is not None and pattern.match_file(path) is not None:
            decided = pattern.include
    return decided


def _spec_at(path: Path) -> GitIgnoreSpec | None:
    """The patterns of the ignore file `path`, or None when there is none. As git does, a
    symlink in place of an ignore file is not followed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        return None
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    return GitIgnoreSpec.from_lines(text.splitlines())


def pack(directory: Path, cap: int = DEFAULT_CAP) -> Snapshot:
    """Pack `directory` into a deterministic .tar.gz (see the module's docstring).

    Raises SnapshotTooLarge when its files hold more than `cap` bytes, and ValueError
    naming the path when `directory` is not a directory or a file cannot be read."""
    root = Path(os.path.realpath(directory))
    if not root.is_dir():
        raise ValueError(f"{directory} is not a directory")
    entries, skipped = _walk(root, cap)
    data, size = _archive(root, entries, cap)
    return Snapshot(
        data=data,
        digest="sha256:" + hashlib.sha256(data).hexdigest(),
        files=sum(entry.kind != "dir" for entry in entries),
        size=size,
        skipped=tuple(sorted(skipped)),
    )


def _walk(root: Path, cap: int) -> tuple[list[_Entry], list[str]]:
    """The entries to pack, sorted by name, and the names skipped. Only metadata is read;
    the walk stops once the files seen are twice the cap, which is over it beyond doubt."""
    entries: list[_Entry] = []
    skipped: list[str] = []
    total = 0
    pending: list[tuple[str, _Rules]] = [("", _Rules(_spec_at(root / IGNORE_FILE), ()))]
    while pending:
        folder, rules = pending.pop()
        spec = _spec_at(root / folder / GIT_IGNORE_FILE)
        if spec is not None:
            rules = _Rules(rules.corral, (*rules.git, (folder, spec)))
        for name, info in _listing(root, folder):
            if name == ".git":
                continue  # a repository's own store, or a worktree's pointer to it
            relative = f"{folder}/{name}" if folder else name
            is_dir = stat.S_ISDIR(info.st_mode)
            if rules.ignores(relative, is_dir):
                continue
            if is_dir:
                entries.append(_Entry(relative, "dir"))
                pending.append((relative, rules))
            elif stat.S_ISREG(info.st_mode):
                entries.append(_Entry(relative, "file", size=info.st_size))
                total += info.st_size
                if total > 2 * cap:
                    raise _too_large(root, entries, total, cap, complete=False)
            elif stat.S_ISLNK(info.st_mode):
                target = _inside_target(root, folder, relative)
                if target is None:
                    skipped.append(relative)
                else:
                    entries.append(_Entry(relative, "link", target=target))
            else:
                skipped.append(relative)  # FIFO, socket or device: nothing to carry
    if total > cap:
        raise _too_large(root, entries, total, cap, complete=True)
    entries.sort(key=lambda entry: entry.name)
    return entries, skipped


def _listing(root: Path, folder: str) -> Iterator[tuple[str, os.stat_result]]:
    """The names in `folder` (relative to `root`), sorted, each with its lstat."""
    path = root / folder
    try:
        with os.scandir(path) as scan:
            found = sorted((item.name, item.stat(follow_symlinks=False)) for item in scan)
    except OSError as error:
        raise ValueError(f"cannot read {error.filename or path}: {error.strerror}") from None
    yield from found


def _inside_target(root: Path, folder: str, relative: str) -> str | None:
    """The symlink `relative`'s target as a path relative to its directory, when it
    resolves (through any chain of links) to something inside `root`; else None."""
    resolved = os.path.realpath(root / relative)
    inside = resolved == str(root) or resolved.startswith(str(root) + os.sep)
    if not inside or not os.path.exists(resolved):
        return None
    return Path(os.path.relpath(resolved, root / folder)).as_posix()


def _too_large(
    root: Path, entries: list[_Entry], total: int, cap: int, *, complete: bool
) -> SnapshotTooLarge:
    files = sorted((e for e in entries if e.kind == "file"), key=lambda e: (-e.size, e.name))
    largest = ", ".join(f"{e.name} ({_human(e.size)})" for e in files[:_LARGEST_SHOWN])
    amount = _human(total) if complete else f"more than {_human(total)}"
    return SnapshotTooLarge(
        f"the files of {root} hold {amount}, over the cap of {_human(cap)}; the largest: "
        f"{largest}; list what the workload does not need in {root / IGNORE_FILE} "
        "(the syntax of .gitignore)"
    )


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _archive(root: Path, entries: list[_Entry], cap: int) -> tuple[bytes, int]:
    """The .tar.gz of `entries` and the content size actually read. A file that grew
    since the walk counts again against the cap."""
    buffer = io.BytesIO()
    size = 0
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.mtime = _FIXED_MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if entry.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            elif entry.kind == "link":
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o644, entry.target
                archive.addfile(info)
            else:
                size += _add_file(archive, info, root / entry.name)
                if size > cap:
                    raise _too_large(root, entries, size, cap, complete=False)
    return buffer.getvalue(), size


def _add_file(archive: tarfile.TarFile, info: tarfile.TarInfo, path: Path) -> int:
    """Add the regular file at `path`; its size. Opened without following a symlink and
    without blocking on a FIFO, in case the walk's file was replaced since."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise ValueError(f"{path} is no longer a regular file: it changed while packed")
        info.type, info.size = tarfile.REGTYPE, found.st_size
        info.mode = 0o755 if found.st_mode & 0o111 else 0o644
        try:
            archive.addfile(info, handle)
        except OSError as error:
            raise ValueError(f"cannot read {path}: {error}") from None
    return found.st_size
