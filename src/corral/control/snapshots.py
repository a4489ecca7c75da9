"""The server's code snapshots: each project's, by digest, as the CLI uploaded them
(`corral submit --code DIR`), until a node's agent asks for one to start a task in.

Kept per project: a digest is not a secret (it shows in `corral describe`), so a member
of one project must not start a task in another project's code by naming its digest, nor
learn by an upload's answer that another project has a tree. An upload is streamed to a
file beside its place while its digest is computed, checked (corral.spec.snapshots: a
tarball a hostile member crafted is refused before any node unpacks it), written to disk
and renamed into place: a crash leaves no half snapshot under a digest, and the same tree
uploaded twice is kept once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from corral.model.spec import DIGEST_PATTERN, DIGEST_PREFIX
from corral.spec.snapshots import check

# The most an upload may hold (compressed), and its tree unpacked: `corral submit --code`
# refuses a tree over 100 MiB of files before it packs it.
DEFAULT_UPLOAD_CAP = 128 << 20
DEFAULT_UNPACKED_CAP = 100 << 20
_DIGEST = re.compile(DIGEST_PATTERN)


class SnapshotRefused(ValueError):
    """An upload that is not the snapshot its digest names, or no snapshot at all."""


class CodeStore:
    """Snapshots under `root`/PROJECT/HEX.tar.gz."""

    def __init__(
        self,
        root: Path,
        upload_cap: int = DEFAULT_UPLOAD_CAP,
        unpacked_cap: int = DEFAULT_UNPACKED_CAP,
    ) -> None:
        self.root = root
        self.upload_cap = upload_cap
        self.unpacked_cap = unpacked_cap

    def path(self, project: str, digest: str) -> Path:
        """Where the snapshot `digest` of `project` is kept (whether or not it is)."""
        if _DIGEST.match(digest) is None or "/" in project or project.startswith("."):
            raise ValueError(f"no snapshot is named {digest!r} in {project!r}")
        return self.root / project / f"{digest.removeprefix(DIGEST_PREFIX)}.tar.gz"

    def has(self, project: str, digest: str) -> bool:
        """Whether the project has the snapshot."""
        return self.path(project, digest).is_file()

    def read(self, project: str, digest: str) -> bytes:
        """The snapshot's bytes; LookupError when the project has none of that digest."""
        try:
            return self.path(project, digest).read_bytes()
        except FileNotFoundError:
            raise LookupError(f"project {project} has no code snapshot {digest}") from None

    async def put(self, project: str, digest: str, chunks: AsyncIterator[bytes]) -> bool:
        """Keep the upload `chunks` as the snapshot `digest` of `project`: True when it is
        new, False when the project had it already (the upload is then read no further).
        SnapshotRefused when it is over the cap, is not what its digest says, or is no
        snapshot a node may unpack."""
        final = self.path(project, digest)
        if final.is_file():
            return False
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = final.with_name(f".{final.name}.{secrets.token_hex(4)}")
        hashed = hashlib.sha256()
        size = 0
        try:
            with open(partial, "xb") as handle:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.upload_cap:
                        raise SnapshotRefused(
                            f"over {self.upload_cap >> 20} MiB: a snapshot may be at most that"
                        )
                    hashed.update(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            found = DIGEST_PREFIX + hashed.hexdigest()
            if found != digest:
                raise SnapshotRefused(f"the upload's digest is {found}, not {digest}")
            try:
                check(partial, self.unpacked_cap)
            except ValueError as error:
                raise SnapshotRefused(str(error)) from None
            os.replace(partial, final)
            _sync_directory(final.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        return True


def _sync_directory(directory: Path) -> None:
    """The rename of a file in `directory` survives a crash of the machine."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
