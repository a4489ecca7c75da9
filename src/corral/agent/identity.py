"""Who a task runs as, what environment it gets, and its own directory.

When the agent runs as root, a task runs as the Unix account of the corral user who
submitted it (as Slurm runs a job as its submitter), with that account's uid, primary gid
and supplementary groups. Otherwise every task runs as the agent's own user.

A task's environment is built from the workload spec and corral's variables only, never
from the agent's: the server's environment may hold credentials, and a variable such as
LD_PRELOAD or PYTHONPATH from the agent's would change what the task runs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.agent.planted import own_directory

# The PATH of a task whose spec gives none: the system's programs, nothing writable by users.
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class Identity:
    """A Unix account as a task runs under it."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def switches_users() -> bool:
    """True when this process may, and so must, run tasks as their submitters."""
    return os.geteuid() == 0


def identity_of(name: str) -> Identity:
    """The account `name` with its groups (as initgroups would set them); LookupError with
    a readable message when there is no such account."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise LookupError(f"there is no Unix account {name!r} on this node") from None
    return Identity(
        entry.pw_name,
        entry.pw_uid,
        entry.pw_gid,
        tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)),
        entry.pw_dir,
    )


def own_identity() -> Identity:
    """The account this process runs as (tasks run as it when it is not root)."""
    uid = os.geteuid()
    try:
        entry = pwd.getpwuid(uid)
        name, home = entry.pw_name, entry.pw_dir
    except KeyError:
        # A container may run with a uid that has no passwd entry.
        name, home = str(uid), os.environ.get("HOME", "/")
    return Identity(name, uid, os.getegid(), tuple(os.getgroups()), home)


def task_environment(spec_env: Mapping[str, str], identity: Identity) -> dict[str, str]:
    """What a task sees: its spec's variables and corral's (in `spec_env`), a safe PATH when
    none is given, and HOME, USER and LOGNAME of the account it runs as."""
    env = {"PATH": SAFE_PATH}
    env.update(spec_env)
    env.update({"HOME": identity.home, "USER": identity.name, "LOGNAME": identity.name})
    return env


def unfit(command: Sequence[str], env: Mapping[str, str], workdir: str | None) -> str | None:
    """Why the kernel would refuse this command, environment or directory (a NUL byte, a
    "=" in a variable's name), or None. The API refuses these already; an agent checks
    again, since a launch may come from elsewhere, and then fails only that task."""
    for index, argument in enumerate(command):
        if "\0" in argument:
            return f"argument {index} of the command holds a NUL byte"
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            return f"the environment variable name {name!r} is not valid"
        if "\0" in value:
            return f"the environment variable {name} holds a NUL byte"
    if workdir is not None and "\0" in workdir:
        return "the working directory holds a NUL byte"
    return None


def workload_directory(root: Path, directory: str, identity: Identity) -> Path:
    """The workload's own directory under `root`, named `directory` (NAME.ID: see
    corral.model.spec.directory_name), owned by the task's account and private to it
    (0700); the same path on every run, so a restart finds its checkpoints, and never a
    deleted workload's of the same name.

    `root` itself is 0711 and written by the agent only: everyone may pass through it to
    their own workload's directory, nobody may list it, and nobody but the agent can plant
    a name (a symlink, say) in it. A `root` another account could have planted is refused
    (corral.agent.planted.Planted) before its mode is set. The agent never creates or
    changes anything inside a workload's directory, since the task's account could have
    put a symlink there.
    """
    own_directory(root, 0o711, "--workloads-dir")
    path = root / directory
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and (not stat.S_ISDIR(info.st_mode) or info.st_uid != identity.uid):
        # Not the task's own (a directory of before NAME.ID that a deleted workload of the
        # same name left, of another account): kept for the operator, out of the way, and
        # never handed to the new owner.
        os.rename(path, root / f".{directory}.{info.st_uid}.{time.time_ns()}")
        info = None
    if info is None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        if os.geteuid() == 0:
            os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
    os.chmod(path, 0o700)
    return path


def unreachable_parent(path: Path) -> Path | None:
    """The first existing parent of `path` that other accounts cannot pass through (no
    execute bit for others), or None when every one lets them."""
    for parent in reversed(path.absolute().parents):
        try:
            mode = os.stat(parent).st_mode
        except OSError:
            return None
        if not mode & stat.S_IXOTH:
            return parent
    return None


def workdirs_root(data_dir: Path) -> Path:
    """Where tasks' copies of their code go (corral.agent.prepare): beside the data
    directory, as the workloads directory is, and on the node's own disk."""
    return data_dir.with_name(f"{data_dir.name}-workdirs")


def environments_root(data_dir: Path) -> Path:
    """Where the node's Python environments go (corral.agent.environments): beside the
    data directory, where every task account may reach them."""
    return data_dir.with_name(f"{data_dir.name}-envs")


def default_workloads_dir(data_dir: Path) -> Path:
    """Beside the data directory, never inside it: DATA_DIR-workloads. The data directory
    is 0700, so a task could not reach a directory in it, and a task's paths must not lead
    into it (the database and the admin token live there)."""
    return data_dir.with_name(f"{data_dir.name}-workloads")
