"""Whether a task's account could start its command here, asked before the task exists.

A command that works in the submitter's shell can fail as a task: the program found
through the submitter's PATH (a virtualenv under a private home directory, say) may be one
the task's account cannot reach, and the task then ends at once with "Permission denied"
(exit 126). On a machine whose agent runs tasks as their submitters, the server asks this
at submit and refuses the workload with the reason instead.

The search follows the kernel's and execvp's rules as a task would meet them: the working
directory must be searchable; a program name without a slash is looked up in the task's
PATH, entry by entry, and the first entry the account may execute wins (an entry it may
not is passed over, as execvp does); a script's `#!` interpreter must be executable too.
A program found nowhere is not refused: it may exist by the time the task starts.

Permissions are read from the modes first; a refusal is confirmed by asking the kernel as
the account itself (`test -x` in a child running as it), so that an ACL that grants access
is honoured.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.agent.identity import SAFE_PATH, Identity

# The longest `#!` line read.
SHEBANG_BYTES = 256


@dataclass(frozen=True, slots=True)
class Refusal:
    """What stops the task: its `workdir` or its `command`, and why."""

    field: str
    reason: str


def cannot_start(
    command: Sequence[str], env: Mapping[str, str], workdir: str | None, identity: Identity
) -> Refusal | None:
    """Why `identity` could not start `command` with the task environment `env` in
    `workdir` on this machine, or None (also when the program is found nowhere here)."""
    if identity.uid == 0 or not command:
        return None
    account = identity.name
    if workdir is not None and os.path.isabs(workdir) and os.path.isdir(workdir):
        blocked = _refused(workdir, identity, directory=True)
        if blocked is not None:
            where = f"the working directory {workdir}"
            return Refusal("workdir", f"{where} cannot be entered by account {account}: {blocked}")
    refusals = []
    candidates = _candidates(command[0], env.get("PATH", SAFE_PATH), workdir)
    if candidates is None:
        return None
    for candidate in candidates:
        if not os.path.exists(candidate):
            continue
        blocked = _refused(candidate, identity)
        if blocked is None:
            interpreter = _interpreter(candidate, identity)
            if interpreter is None or not os.path.exists(interpreter):
                return None
            blocked = _refused(interpreter, identity)
            if blocked is None:
                return None
            blocked = f"its interpreter {interpreter}: {blocked}"
        refusals.append(f"{candidate} ({blocked})")
    if not refusals:
        return None
    return Refusal(
        "command", f"account {account} cannot execute {command[0]!r}: " + "; ".join(refusals)
    )


def _candidates(program: str, path: str, workdir: str | None) -> list[str] | None:
    """Where execvp would look for `program`, in order; None where that depends on a
    working directory not known here (a relative path without `workdir`)."""
    if "/" in program:
        if os.path.isabs(program):
            return [program]
        return [os.path.join(workdir, program)] if workdir else None
    found = []
    for entry in path.split(":"):
        if not os.path.isabs(entry):
            if not workdir:
                return None
            entry = os.path.join(workdir, entry)
        found.append(os.path.join(entry, program))
    return found


def _refused(path: str, identity: Identity, *, directory: bool = False) -> str | None:
    """Why `identity` may not execute the file `path` (or enter the directory), read from
    the modes; a refusal is confirmed by the kernel as the account (ACLs)."""
    reason = _by_modes(path, identity, directory)
    if reason is None or _kernel_allows(path, identity):
        return None
    return reason


def _by_modes(path: str, identity: Identity, directory: bool) -> str | None:
    absolute = os.path.abspath(path)
    parts = absolute.split("/")[1:]
    walked = ""
    for part in parts[:-1] if not directory else parts:
        walked += "/" + part
        try:
            info = os.stat(walked)
        except OSError as error:
            return f"{walked}: {error.strerror}"
        if not _may(info, identity, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            return f"{walked} (mode {stat.S_IMODE(info.st_mode):o}) is closed to it"
    if directory:
        return None
    try:
        info = os.stat(absolute)
    except OSError as error:
        return error.strerror
    if not stat.S_ISREG(info.st_mode):
        return "not a file"
    if not _may(info, identity, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
        return f"mode {stat.S_IMODE(info.st_mode):o}, not executable by it"
    return None


def _may(info: os.stat_result, identity: Identity, user: int, group: int, other: int) -> bool:
    if info.st_uid == identity.uid:
        return bool(info.st_mode & user)
    if info.st_gid in identity.groups or info.st_gid == identity.gid:
        return bool(info.st_mode & group)
    return bool(info.st_mode & other)


def _kernel_allows(path: str, identity: Identity) -> bool:
    """`test -x PATH` run as the account: the kernel's own answer, ACLs included."""
    try:
        done = subprocess.run(
            ["test", "-x", path],
            user=identity.uid,
            group=identity.gid,
            extra_groups=list(identity.groups),
            env={"PATH": SAFE_PATH},
            cwd="/",
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _interpreter(path: str, identity: Identity) -> str | None:
    """The interpreter a script names on its `#!` line, when the account may read it
    (otherwise the interpreter could not read the script either: its own refusal)."""
    if _by_modes(path, identity, False) is not None:
        return None
    info = os.stat(path)
    if not _may(info, identity, stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH):
        return None
    try:
        with open(path, "rb") as handle:
            head = handle.read(SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    if not words:
        return None
    interpreter = os.fsdecode(words[0])
    return interpreter if os.path.isabs(interpreter) else None
