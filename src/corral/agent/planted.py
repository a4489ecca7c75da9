"""The directories corral writes in (the data directory, the workloads directory), refused
when another account could have planted them, and the private files it writes there.

Under a directory every account may write (/tmp), anyone may create the name corral is
told to use before corral does: a directory of their own, in which corral would then
write the admin token, or a symlink, through which it would change the mode of whatever
it points at. So each component of such a path, from the first directory every account
may write down, and the directory itself, must belong to the account corral runs as or to
root and must not be a symlink; and a directory every account may write without the
sticky bit is refused outright, since anyone may rename what is in it. Nothing is created
or changed before a path passes (docs/security.md).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path


class Planted(PermissionError):
    """A path corral would write in that another account could have planted: one line
    naming the path and its owner."""


def refuse_planted(path: Path, option: str) -> None:
    """Raise Planted, naming `option` (--data-dir), when another account could have planted
    `path` or a component of it (see the module's docstring); a part of `path` that does
    not exist yet is corral's to make."""
    problem = _problem(Path(os.path.abspath(path)))
    if problem is not None:
        raise Planted(f"{option} {path} is refused: {problem}")


def own_directory(path: Path, mode: int, option: str) -> None:
    """Make `path` (and its missing parents) and give it `mode`, after refuse_planted; it is
    checked again once made, since another account may create a name between the check
    and mkdir, and its mode is set through a descriptor that never follows a symlink."""
    refuse_planted(path, option)
    path.mkdir(parents=True, exist_ok=True)
    refuse_planted(path, option)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path`, readable by this account only (0600): a new file is created
    with O_EXCL, an existing one is rewritten only when it is a regular file of this
    account; a symlink is never followed (O_NOFOLLOW), and a FIFO never blocks."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        fd = _rewritable(path)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _rewritable(path: Path) -> int:
    """An existing file of this account at `path`, opened for writing and emptied."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        # ELOOP: a symlink; ENXIO: a FIFO nobody reads.
        if error.errno not in (errno.ELOOP, errno.ENXIO):
            raise
        raise _not_ours(path, os.lstat(path)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise _not_ours(path, info)
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_ours(path: Path, info: os.stat_result) -> Planted:
    if stat.S_ISLNK(info.st_mode):
        kind = "a symlink"
    elif stat.S_ISREG(info.st_mode):
        kind = "a file"
    else:
        kind = "a special file"
    return Planted(
        f"{path} is {kind} owned by {_owner(info.st_uid)}, not a file of this account's: "
        "corral does not write through it"
    )


def _problem(path: Path) -> str | None:
    """Why another account could have planted `path` (absolute), or None."""
    holder = Path(path.anchor)
    # Whether every account may write `holder`, and whether it is sticky.
    open_, sticky = False, True
    for name in path.parts[1:]:
        current = holder / name
        if open_ and not sticky:
            return (
                f"{holder} may be written by every account and has no sticky bit, so anyone "
                f"may replace {current}"
            )
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return None  # corral makes it, and everything below it
        if open_ or current == path:
            problem = _foreign(current, info)
            if problem is not None:
                return problem
        mode = os.stat(current).st_mode
        open_, sticky = bool(mode & stat.S_IWOTH), bool(mode & stat.S_ISVTX)
        holder = current
    if open_:
        return f"{path} may be written by every account, who may have planted files in it"
    return None


def _foreign(path: Path, info: os.stat_result) -> str | None:
    """Why `path`, whose lstat is `info`, is not corral's own: a symlink, or another
    account's."""
    if stat.S_ISLNK(info.st_mode):
        return (
            f"{path} is a symlink (to {os.readlink(path)}) made by {_owner(info.st_uid)}, "
            "and corral does not follow one there"
        )
    me = os.geteuid()
    if info.st_uid in (me, 0):
        return None
    mine = "root" if me == 0 else f"{_owner(me)} (the account corral runs as) or root"
    return (
        f"{path} is owned by {_owner(info.st_uid)}, not by {mine}; "
        "another account may have planted it"
    )


def _owner(uid: int) -> str:
    """An account's name, or its number when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
