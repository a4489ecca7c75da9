"""A workload's code as a content-addressed snapshot: `pack` turns a directory into a
.tar.gz named by its sha256, and `check` validates such an archive without unpacking it.

`corral submit --code DIR` packs DIR on the user's machine; the server stores the bytes
under their digest and every node unpacks a digest once. So the digest must depend on
the tree's content only: entries are sorted and every owner, time and permission that
git does not keep is fixed, so two clones of one repository give one digest.

What is left out follows git (`.gitignore` at any depth, `.git/` itself) and a
`.corralignore` at the root in the same syntax, which has the last word: it may leave
out what git keeps (datasets, checkpoints) or take back what git ignores (`!build/`).
Symlinks are kept only when they stay inside the tree, and special files never travel;
both are named in `Snapshot.skipped` so that the user hears what did not go.

`check` is the other side's wall: an upload is hostile until proven otherwise, so it is
read as a stream with every size bounded before it is decompressed, and every member
that could write outside the tree or surprise the extractor is refused by name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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
# Headers are read into memory whole (a pax header of any size), so the decompressed
# stream is bounded by what the members seen so far can need: each member's header
# blocks, with a little room for long names, plus one slack for a few very long ones.
_HEADER_ROOM = 3 * tarfile.BLOCKSIZE
_HEADER_SLACK = 1024 * 1024
# After the two zero blocks, tar pads to its record size (10 KiB, more for some tools).
_TRAILER_ROOM = 1024 * 1024
# As the kernel's limit on symlinks followed in one lookup (ELOOP).
_MAX_HOPS = 40


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
class SnapshotInfo:
    """What `check` found in an archive: regular files and symlinks, and the content size
    in bytes once unpacked."""

    files: int
    size: int


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


def check(source: BinaryIO | Path, max_unpacked: int, max_members: int = 100_000) -> SnapshotInfo:
    """Validate the .tar.gz `source` without unpacking it.

    Accepted: regular files, directories and symlinks, under relative names without "..",
    each once, symlinks resolving (through the archive's other links) inside the tree,
    at most `max_members` members holding at most `max_unpacked` bytes. Anything else,
    and bytes that are not a .tar.gz, raise ValueError naming the member and the problem.
    Decompression never runs ahead of what the headers seen so far allow, so a gzip bomb
    is refused after reading little of it."""
    if isinstance(source, Path):
        with source.open("rb") as handle:
            return _check(handle, max_unpacked, max_members)
    return _check(source, max_unpacked, max_members)


def _check(source: BinaryIO, max_unpacked: int, max_members: int) -> SnapshotInfo:
    ledger = _Ledger(max_unpacked, max_members)
    stream = _BoundedStream(gzip.GzipFile(fileobj=source, mode="rb"), ledger)
    try:
        with tarfile.TarFile(fileobj=stream, mode="r") as archive:  # type: ignore[arg-type]
            for member in archive:
                ledger.add(member)
        stream.finish()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise ValueError(f"not a valid .tar.gz archive: {error}") from None
    ledger.check_links()
    return SnapshotInfo(files=ledger.files, size=ledger.size)


class _Ledger:
    """What an archive held so far: each name's kind, the sizes, and the symlinks, whose
    targets are resolved once every member is known."""

    def __init__(self, max_unpacked: int, max_members: int) -> None:
        self.max_unpacked, self.max_members = max_unpacked, max_members
        # name -> "dir", "file", "link", or "implied": a directory only named as a parent.
        self.kinds: dict[str, str] = {}
        self.links: dict[str, str] = {}
        self.members = self.files = self.size = 0
        self.padded = 0  # the stream's bytes of content, padded to tar's blocks
        self.last = ""

    def room(self) -> int:
        """How far into the decompressed stream the members seen so far may reach."""
        return self.padded + (self.members + 1) * _HEADER_ROOM + _HEADER_SLACK

    def add(self, member: tarfile.TarInfo) -> None:
        """Record `member`, or raise ValueError saying what is wrong with it."""
        label = repr(member.name)
        self.members += 1
        if self.members > self.max_members:
            raise ValueError(f"member {label}: the archive has more than {self.max_members}")
        name = _clean(member.name, label)
        self.last = name
        kind = self._kind(member, label)
        if kind == "file":
            self.size += member.size
            if self.size > self.max_unpacked:
                raise ValueError(
                    f"member {label}: the content unpacked exceeds {self.max_unpacked} bytes"
                )
            self.padded += -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        if not name:
            if kind != "dir":
                raise ValueError(f"member {label}: names the root of the tree")
            return
        self._place(name, kind, label)
        if kind == "link":
            self.links[name] = member.linkname
        if kind != "dir":
            self.files += 1

    def _kind(self, member: tarfile.TarInfo, label: str) -> str:
        if member.issym():
            if not member.linkname:
                raise ValueError(f"member {label}: a symlink with an empty target")
            if member.linkname.startswith("/"):
                raise ValueError(
                    f"member {label}: a symlink to the absolute path {member.linkname!r}"
                )
            return "link"
        if member.islnk():
            raise ValueError(f"member {label}: a hard link (to {member.linkname!r})")
        if member.isdir():
            return "dir"
        if member.isreg() and not member.issparse():
            return "file"
        if member.ischr() or member.isblk():
            what = "a device"
        elif member.isfifo():
            what = "a FIFO"
        elif member.issparse():
            what = "a sparse file"
        else:
            what = f"of the unsupported tar type {member.type!r}"
        raise ValueError(f"member {label}: {what}; only files, directories and symlinks")

    def _place(self, name: str, kind: str, label: str) -> None:
        """Record `name` as `kind`: its parents must be directories, and it must be new
        (a directory implied by earlier members may still be declared once)."""
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            above = self.kinds.setdefault(parent, "implied")
            if above in ("file", "link"):
                raise ValueError(f"member {label}: its parent {parent!r} is a {above}")
        found = self.kinds.get(name)
        if found == "implied" and kind == "dir":
            self.kinds[name] = kind
        elif found == "implied":
            raise ValueError(f"member {label}: a {kind} where earlier members have a directory")
        elif found is not None:
            raise ValueError(f"member {label}: the name appears twice")
        else:
            self.kinds[name] = kind

    def check_links(self) -> None:
        """Refuse a symlink that resolves outside the tree, directly or through others."""
        for name in sorted(self.links):
            problem = self._escape(name)
            if problem is not None:
                raise ValueError(f"member {name!r}: a symlink to {self.links[name]!r} {problem}")

    def _escape(self, name: str) -> str | None:
        """Why the link `name` leaves the tree when followed as the kernel would, or None
        (a link inside the tree to nothing is harmless)."""
        path = name.split("/")[:-1]
        pending = self.links[name].split("/")
        hops, via = 0, ""
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not path:
                    return "that points outside the tree" + (f" through {via!r}" if via else "")
                path.pop()
                continue
            path.append(part)
            joined = "/".join(path)
            if self.kinds.get(joined) == "link":
                hops += 1
                if hops > _MAX_HOPS:
                    return "in a loop of symlinks"
                via = joined
                path.pop()
                pending = self.links[joined].split("/") + pending
        return None


def _clean(name: str, label: str) -> str:
    """`name` without "." components and repeated or trailing "/"; refused when absolute
    or with a ".." component."""
    if name.startswith("/"):
        raise ValueError(f"member {label}: an absolute name")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"member {label}: a '..' component in its name")
    if "\x00" in name:
        raise ValueError(f"member {label}: a NUL character in its name")
    return "/".join(parts)


class _BoundedStream:
    """The decompressed stream as tarfile reads it: forward only, and never past what the
    ledger's members allow, so that no header (read whole into memory) nor skipped content
    decompresses more than the archive may hold."""

    def __init__(self, inner: gzip.GzipFile, ledger: _Ledger) -> None:
        self._inner, self._ledger, self._position = inner, ledger, 0

    def _refuse(self) -> ValueError:
        after = f"after member {self._ledger.last!r}" if self._ledger.last else "at its start"
        return ValueError(
            f"the archive's headers {after} are larger than any archive needs "
            "(a decompression bomb?)"
        )

    def read(self, size: int = -1) -> bytes:
        if size < 0 or self._position + size > self._ledger.room():
            raise self._refuse()
        data = self._inner.read(size)
        self._position += len(data)
        return data

    def seek(self, position: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET or position < self._position:
            raise ValueError("the archive's reader went backwards, which a tar stream never does")
        if position > self._ledger.room():
            raise self._refuse()
        self._position = self._inner.seek(position)
        return self._position

    def tell(self) -> int:
        return self._position

    def finish(self) -> None:
        """Read to the end, so that gzip checks its length and CRC; only tar's padding may
        follow the archive's end."""
        left = _TRAILER_ROOM
        while left >= 0:
            data = self._inner.read(min(_CHUNK, left + 1))
            if not data:
                return
            left -= len(data)
        raise ValueError(f"more than {_TRAILER_ROOM} bytes follow the archive's end")
