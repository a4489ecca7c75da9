"""What a code snapshot may be (corral.sdk.snapshot packs them): `check` validates a
.tar.gz without unpacking it, for the server that takes an upload and the node that is
about to unpack one.

An upload is hostile until proven otherwise, so it is read as a stream with every size
bounded before it is decompressed, and every member that could write outside the tree or
surprise the extractor is refused by name.
"""

from __future__ import annotations

import gzip
import os
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_CHUNK = 1024 * 1024
# Headers are read into memory whole (a pax header of any size), so the decompressed
# stream is bounded by what the members seen so far can need: each member's header
# blocks, with a little room for long names, plus one slack for a few very long ones.
_HEADER_ROOM = 3 * tarfile.BLOCKSIZE
_HEADER_SLACK = 1024 * 1024
# After the two zero blocks, tar pads to its record size (10 KiB, more for some tools).
_TRAILER_ROOM = 1024 * 1024
# As the kernel's limit on symlinks followed in one lookup (ELOOP).
_MAX_HOPS = 40


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What `check` found in an archive: regular files and symlinks, and the content size
    in bytes once unpacked."""

    files: int
    size: int


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
