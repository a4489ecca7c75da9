"""A workload's Python environment, built with uv once per node and shared by every task
that asks for the same one.

An environment is known by its key: the hash of its files (a requirements file, or a
pyproject.toml with or without its uv.lock), its Python version, its index options, the
node's platform and the node's own index options. The first `ensure` of a key builds a
virtual environment under the cache's root; every later one, in this process or another,
finds its completion marker and returns at once. A per-key lock makes concurrent callers
wait for the one build, and the marker is written last, so a build killed half-way is
removed and redone, never taken as done.

Walls. Requirements come from users who may be hostile: a line may name a local path
(`/root/x.whl`, `-r /etc/...`, `file://`, `--find-links /another/projects/dir`), and a
source distribution's build runs arbitrary code. So when the agent runs as root, uv runs as
an unprivileged build account (`nobody` by default) in a private build directory with its
own HOME, uv cache and a minimal environment, inside a process namespace of its own (so
that nothing it starts outlives the build): it reads only what every account may. The
finished environment is then copied by the agent into the cache, owned by root with
directories 0755 and files 0644 or 0755: every task account may run it, none may change
it, and no process of the build can hold a file of it open for writing. The venv is made
relocatable (`uv venv --relocatable`), so the copy works from its new place.

One limit remains: every build shares the build account, so a build's code could tamper
with a concurrent build of another environment (never with a finished one). A node whose
users distrust each other that much should build one environment at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform as platform_module
import re
import shutil
import stat
import subprocess
import sysconfig
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from urllib.parse import urlparse

from uv import find_uv_bin

from corral.agent.filelocks import try_lock
from corral.agent.identity import SAFE_PATH, Identity, identity_of, unreachable_parent
from corral.model.spec import PythonEnv

__all__ = ["EnvironmentCache", "EnvironmentFailed", "PythonEnv", "environment_key"]

GiB = 1024**3
MARKER = ".corral-environment"
# The file sets a workload may send: a requirements file, a project, or a locked project.
FILE_SETS = (
    frozenset({"requirements.txt"}),
    frozenset({"pyproject.toml"}),
    frozenset({"pyproject.toml", "uv.lock"}),
)
_VERSION = re.compile(r"\d+(\.\d+){0,2}")
# How often a running build is looked at for progress, in seconds.
_POLL = 0.5
# uv's own prefixes on an error's lines: one starts a new part of the message.
_PART_PREFIXES = ("error:", "cause:", "caused by:", "×", "╰─▶", "├─▶", "hint:")
# uv's lines that say what it did rather than what went wrong.
_CHATTER = ("Using ", "Resolved ", "Prepared ", "Installed ", "Audited ", "Creating ",
            "Activate with", "warning:", "DEBUG", "Uninstalled ", "Downloading ", "Building ",
            "Built ", " + ", " - ")  # fmt: skip


class EnvironmentFailed(Exception):
    """An environment could not be built: `message` is uv's own error, trimmed to its useful
    lines, or corral's when the node cannot build it at all."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def environment_key(
    env: PythonEnv,
    platform: str,
    *,
    node_index_url: str | None = None,
    node_find_links: tuple[str, ...] = (),
) -> str:
    """The sha256 (hex) of a canonical encoding of everything that decides what gets
    built: `env`'s files (in any order), version and index options, the node's `platform`
    and the node's own index options."""
    document = {
        "format": 1,
        "files": sorted([name, text] for name, text in env.files),
        "version": env.version,
        "index_url": env.index_url,
        "find_links": list(env.find_links),
        "platform": platform,
        "node_index_url": node_index_url,
        "node_find_links": list(node_find_links),
    }
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(encoded.encode()).hexdigest()


def check_python_env(env: PythonEnv) -> None:
    """ValueError naming the field when `env` is not one this module builds: an unknown
    set of files, a version that is not like "3.11", or a workload index option that is
    not an http(s) URL (a workload may not point uv at the node's directories)."""
    names = [name for name, _ in env.files]
    if len(set(names)) != len(names) or frozenset(names) not in FILE_SETS:
        raise ValueError(
            f"files: {sorted(names)} is not one of requirements.txt, pyproject.toml, "
            "or pyproject.toml with uv.lock"
        )
    for name, text in env.files:
        if "\0" in text:
            raise ValueError(f"files: {name} holds a NUL byte")
    if env.version is not None and not _VERSION.fullmatch(env.version):
        raise ValueError(f"version: {env.version!r} is not a Python version such as 3.11")
    if env.index_url is not None:
        _check_url("index_url", env.index_url)
    for link in env.find_links:
        _check_url("find_links", link)


def _check_url(field: str, value: str) -> None:
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc or "\0" in value:
        raise ValueError(f"{field}: {value!r} is not an http or https URL")


def node_platform() -> str:
    """This node's platform as part of an environment's key: OS, machine and C library."""
    libc, libc_version = platform_module.libc_ver()
    return f"{sysconfig.get_platform()}-{libc or 'nolibc'}{libc_version}"


class EnvironmentCache:
    """The node's environments under `root`, at most `cap_bytes` of them kept by `prune`.

    `index_url` and `find_links` are the node's own index options (an admin's: they may be
    local directories); uv consults them after the workload's. When the agent runs as root,
    uv runs as `build_user` (None: as the agent itself, which walls nothing off)."""

    def __init__(
        self,
        root: Path,
        cap_bytes: int = 20 * GiB,
        index_url: str | None = None,
        find_links: tuple[str, ...] = (),
        build_user: str | None = "nobody",
    ) -> None:
        self.root = root
        self.cap_bytes = cap_bytes
        self.index_url = index_url
        self.find_links = find_links
        self.build_user = build_user
        self.platform = node_platform()
        self._envs = root / "envs"
        self._builds = root / "builds"
        self._locks = root / "locks"
        closed = unreachable_parent(root)
        if os.geteuid() == 0 and closed is not None:
            # The build account must reach its build directory, and tasks their venvs.
            raise PermissionError(
                f"{root} is inside {closed}, which other accounts cannot enter: neither "
                "the build account nor the tasks could reach the environments"
            )
        # Modes: tasks pass through root to envs and list nothing else; the build account
        # passes through builds to its own directory only.
        for path, mode in (
            (root, 0o755),
            (self._envs, 0o755),
            (self._builds, 0o711),
            (self._locks, 0o700),
        ):
            path.mkdir(parents=True, exist_ok=True)
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                raise PermissionError(f"{path} is not a directory of this account")
            os.chmod(path, mode)
        self._uv: str | None = None

    def key_of(self, env: PythonEnv) -> str:
        """`env`'s key on this node (its directory's name)."""
        return environment_key(
            env, self.platform, node_index_url=self.index_url, node_find_links=self.find_links
        )

    def built(self, env: PythonEnv) -> Path | None:
        """The virtual environment for `env` when it is built already (a task adopted
        after a restart runs in it), else None; builds nothing."""
        path = self._envs / self.key_of(env)
        return path if (path / MARKER).is_file() else None

    def ensure(self, env: PythonEnv, progress: Callable[[str], None] = lambda _: None) -> Path:
        """The virtual environment for `env` (its bin/python runs it), built now unless it
        was built before; `progress` hears short texts while it builds. ValueError for an
        `env` check_python_env refuses; EnvironmentFailed when it cannot be built, which
        leaves nothing of it behind."""
        check_python_env(env)
        key = self.key_of(env)
        path = self._envs / key
        with self._locked(key, progress) as waited:
            if (path / MARKER).is_file():
                _used(path / MARKER)
                if waited:
                    progress("building environment: done")
                return path
            self._discard(key)
            try:
                self._build(env, key, path, progress)
            except BaseException:
                self._discard(key)
                raise
        progress("building environment: done")
        return path

    def prune(self, in_use: Collection[str] = (), grace: float = 60.0) -> list[str]:
        """Remove the least recently used environments beyond `cap_bytes`, and return their
        keys. Never removed: the keys `in_use` (of running tasks), one being built, and one
        used in the last `grace` seconds (just returned to a task about to start)."""
        built: list[tuple[int, int, str]] = []
        for entry in os.scandir(self._envs):
            try:
                info = os.stat(Path(entry.path) / MARKER)
                size = int(json.loads((Path(entry.path) / MARKER).read_text())["size_bytes"])
            except (OSError, ValueError, KeyError):
                continue  # being built, or a leftover its next ensure removes
            built.append((info.st_mtime_ns, size, entry.name))
        built.sort()  # the least recently used first
        total, removed = sum(size for _, size, _ in built), []
        now = time.time_ns()
        for used, size, key in built:
            if total <= self.cap_bytes:
                break
            if key in in_use or now - used < grace * 1e9:
                continue
            with self._try_locked(key) as locked:
                # Used again since it was looked at: kept.
                if locked and os.stat(self._envs / key / MARKER).st_mtime_ns == used:
                    self._discard(key)
                    removed.append(key)
                    total -= size
        for leftover in os.scandir(self._builds):
            # A build whose agent was killed, of a key nobody asked for again.
            with self._try_locked(leftover.name.partition(".")[0]) as locked:
                if locked:
                    _remove(Path(leftover.path))
        return removed

    @contextlib.contextmanager
    def _locked(self, key: str, progress: Callable[[str], None]) -> Iterator[bool]:
        """Hold `key`'s lock (an flock, which threads and processes alike wait on); yields
        whether another holder had to be waited for."""
        fd = os.open(self._locks / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            waited = False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                waited = True
                progress("building environment: waiting for its build by another workload")
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield waited
        finally:
            os.close(fd)

    def _try_locked(self, key: str) -> contextlib.AbstractContextManager[bool]:
        return try_lock(self._locks / f"{key}.lock")

    def _discard(self, key: str) -> None:
        """Remove what there is of `key` (its lock held): the marker first, so that a
        removal cut short is never taken as a finished environment, then the rest."""
        path = self._envs / key
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path / MARKER)
        _remove(path)
        for leftover in self._builds.glob(f"{key}.*"):
            _remove(leftover)

    def _build(self, env: PythonEnv, key: str, path: Path, progress: Callable[[str], None]) -> None:
        builder = self._builder()
        build = _Build(self._builds / f"{key}.{uuid.uuid4().hex}", builder, self._uv_bin())
        try:
            build.prepare(env.files)
            progress(f"building environment: Python {env.version or '(node default)'}")
            self._make_venv(build, env.version)
            progress("building environment: resolving")
            pins = self._resolve(build, env)
            names = _pinned_names(pins)
            progress(f"building environment: {len(names)} packages to install")
            build.write("resolved.txt", pins)
            self._install(build, env, names, progress)
            progress("building environment: copying into place")
            size = _copy_tree(build.venv, path)
            marker = {"key": key, "size_bytes": size, "packages": len(names), "built": time.time()}
            _write_marker(path, json.dumps(marker))
        finally:
            _remove(build.dir)

    def _builder(self) -> Identity | None:
        """The account uv runs as, None for the agent's own."""
        if os.geteuid() != 0 or self.build_user is None:
            return None
        try:
            return identity_of(self.build_user)
        except LookupError:
            raise EnvironmentFailed(
                f"the build account {self.build_user!r} does not exist on this node: "
                "create it or give the agent another build user"
            ) from None

    def _uv_bin(self) -> str:
        """uv's binary, where the build account can run it: a copy under root when the
        agent's own is closed to other accounts (an agent installed under /root)."""
        if self._uv is None:
            found = find_uv_bin()
            self._uv = found
            if os.geteuid() == 0 and unreachable_parent(Path(found)) is not None:
                tools = self.root / "tools"
                tools.mkdir(exist_ok=True)
                os.chmod(tools, 0o755)
                copy = tools / "uv"
                if not copy.exists() or copy.stat().st_size != os.stat(found).st_size:
                    staging = tools / f"uv.{uuid.uuid4().hex}"
                    shutil.copyfile(found, staging)
                    os.chmod(staging, 0o755)
                    os.replace(staging, copy)
                self._uv = str(copy)
        return self._uv

    def _index_options(self, env: PythonEnv) -> list[str]:
        """uv's index options: the workload's first, the node's after. uv searches extra
        indexes before the main one, so the workload's index is the extra one when the
        node has its own."""
        options: list[str] = []
        node_index = _as_url(self.index_url) if self.index_url else None
        if env.index_url and node_index:
            options += ["--extra-index-url", env.index_url, "--index-url", node_index]
        elif env.index_url or node_index:
            options += ["--index-url", env.index_url or node_index or ""]
        for link in (*env.find_links, *self.find_links):
            options += ["--find-links", link]
        return options

    def _make_venv(self, build: _Build, version: str | None) -> None:
        wanted = ["--python", version] if version else []
        try:
            build.uv(["venv", "--no-config", "--relocatable", *wanted, str(build.venv)])
        except EnvironmentFailed as failed:
            closed = None
            if build.builder and "no interpreter found" in failed.message.lower():
                closed = self._closed_python(version)
            if closed is None:
                raise
            raise EnvironmentFailed(
                f"{failed.message}: the only Python {version or ''} found on this node is "
                f"{closed}, which task accounts cannot run; install one every account may "
                "run (in /usr/local/bin or /usr/bin)"
            ) from None
        interpreter = Path(os.path.realpath(build.venv / "bin" / "python"))
        if build.builder is not None and (
            unreachable_parent(interpreter) is not None
            or not os.stat(interpreter).st_mode & stat.S_IXOTH
        ):
            raise EnvironmentFailed(
                f"the Python at {interpreter} is not one every account may run; install "
                "one that is (in /usr/local/bin or /usr/bin)"
            )

    def _closed_python(self, version: str | None) -> str | None:
        """A Python of `version` the agent itself finds (on its own PATH) and the build
        account could not, or None."""
        uv = self._uv_bin()
        command = [uv, "python", "find", "--no-config", *([version] if version else [])]
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        found = done.stdout.strip()
        if done.returncode != 0 or not found:
            return None
        return os.path.realpath(found)

    def _resolve(self, build: _Build, env: PythonEnv) -> str:
        """The environment's packages pinned, as a requirements file's text."""
        names = {name for name, _ in env.files}
        if "uv.lock" in names:
            return build.uv(
                ["export", "--frozen", "--no-emit-project", "--no-config", "--quiet"],
                cwd=build.input,
            )
        source = "requirements.txt" if "requirements.txt" in names else "pyproject.toml"
        return build.uv(
            [
                "pip",
                "compile",
                str(build.input / source),
                "--no-config",
                "--quiet",
                "--no-header",
                "--python",
                str(build.venv / "bin" / "python"),
                *self._index_options(env),
            ]
        )

    def _install(
        self, build: _Build, env: PythonEnv, names: set[str], progress: Callable[[str], None]
    ) -> None:
        """`uv pip sync` of the pins, reporting how many of their packages (`names`) are ready:
        unpacked into the build's uv cache (uv's archive-v0: one directory per prepared
        wheel, the wheel's dist-info inside) or installed into the venv."""
        total = len(names)
        patterns = [(build.cache, "archive-v*/*/*.dist-info"), (build.venv, "lib/*/*/*.dist-info")]
        last = -1

        def watch() -> None:
            nonlocal last
            ready: set[str] = set()
            for base, pattern in patterns:
                ready.update(_dist_name(found.name) for found in base.glob(pattern))
            count = len(ready & names)
            if count != last:
                last = count
                progress(f"building environment: {count} of {total} packages")

        build.uv(
            [
                "pip",
                "sync",
                str(build.dir / "resolved.txt"),
                "--no-config",
                "--python",
                str(build.venv / "bin" / "python"),
                *self._index_options(env),
            ],
            watch=watch,
        )
        watch()


class _Build:
    """One build's private directory, owned by the account uv runs as: its HOME, uv cache,
    temporary files, input files and venv."""

    def __init__(self, directory: Path, builder: Identity | None, uv: str) -> None:
        self.dir = directory
        self.builder = builder
        self.uv_bin = uv
        self.home = directory / "home"
        self.cache = directory / "cache"
        self.input = directory / "input"
        self.venv = directory / "venv"

    def prepare(self, files: tuple[tuple[str, str], ...]) -> None:
        """Make the directory and write the input files, then give it all to the builder
        (the top directory last: until then nobody else can reach what is in it)."""
        os.mkdir(self.dir, 0o700)
        made = [self.home, self.cache, self.dir / "tmp", self.input]
        for path in made:
            os.mkdir(path, 0o700)
        for name, text in files:
            (self.input / name).write_text(text)
            made.append(self.input / name)
        if self.builder is not None:
            for path in [*made, self.dir]:
                os.chown(path, self.builder.uid, self.builder.gid, follow_symlinks=False)

    def write(self, name: str, text: str) -> None:
        """A file the builder may read, written by the agent into the builder's directory
        without following anything the builder could have put at that name."""
        fd = os.open(self.dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        # Readable whatever the agent's umask (corral up's is 077).
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)

    def environment(self) -> dict[str, str]:
        """uv's whole environment: nothing of the agent's but its PATH when it builds as
        itself (the build account gets the system's), and no Python downloads."""
        return {
            "PATH": SAFE_PATH if self.builder else os.environ.get("PATH", SAFE_PATH),
            "HOME": str(self.home),
            "TMPDIR": str(self.dir / "tmp"),
            "UV_CACHE_DIR": str(self.cache),
            "UV_PYTHON_INSTALL_DIR": str(self.home / "python"),
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_PROGRESS": "1",
            "NO_COLOR": "1",
            "LANG": "C.UTF-8",
        }

    def uv(
        self, arguments: list[str], cwd: Path | None = None, watch: Callable[[], None] | None = None
    ) -> str:
        """Run uv with `arguments` as the builder and return its output; EnvironmentFailed
        with its trimmed error when it fails. As root, uv is process 1 of a new process
        namespace, so that whatever a build starts ends with it."""
        command = [self.uv_bin, *arguments]
        if self.builder is not None:
            who = [f"--reuid={self.builder.uid}", f"--regid={self.builder.gid}"]
            command = [
                "unshare",
                "--pid",
                "--fork",
                "--kill-child",
                "--",
                "setpriv",
                *who,
                "--clear-groups",
                "--",
                *command,
            ]
        process = subprocess.Popen(
            command,
            cwd=cwd or self.dir,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        while True:
            try:
                out, err = process.communicate(timeout=_POLL)
                break
            except subprocess.TimeoutExpired:
                if watch is not None:
                    watch()
            except BaseException:
                process.kill()
                process.wait()
                raise
        if process.returncode != 0:
            raise EnvironmentFailed(trimmed(err) or f"uv {arguments[0]} failed")
        return out


def trimmed(stderr: str, limit: int = 2000) -> str:
    """uv's error output as one message: its report lines (without uv's own prefixes)
    joined with ": ", lines it wrapped joined back, its chatter left out."""
    parts: list[str] = []
    for line in stderr.splitlines():
        text = line.strip()
        if not text or line.startswith(_CHATTER):
            continue
        lowered = text.lower()
        prefix = next((p for p in _PART_PREFIXES if lowered.startswith(p)), None)
        if prefix is not None:
            body = text[len(prefix) :].strip()
            parts.append(f"hint: {body}" if prefix == "hint:" else body)
        elif parts:
            parts[-1] = f"{parts[-1]} {text.lstrip('│ ')}"
        else:
            parts.append(text)
    message = ": ".join(part for part in parts if part)
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _pinned_names(requirements: str) -> set[str]:
    """The normalised names a pinned requirements file installs (`name==1.0`, `name @
    URL`, a line of options or a comment names none)."""
    names = set()
    for line in requirements.splitlines():
        found = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(==|@)", line)
        if found:
            names.add(_normal(found.group(1)))
    return names


def _dist_name(directory: str) -> str:
    """The normalised project name of a `name-version.dist-info` directory."""
    return _normal(directory.split("-", 1)[0])


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _as_url(location: str) -> str:
    """A node's index given as a directory, as the file:// URL uv wants."""
    return Path(location).absolute().as_uri() if "://" not in location else location


def _copy_tree(source: Path, target: Path) -> int:
    """Copy the build's venv at `source` to `target` as the agent's own: directories 0755,
    files 0644 (0755 when the build made them executable), symlinks as they are; never
    following a symlink of the build's. Returns the bytes of its files."""
    fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return _copy_directory(fd, target)
    finally:
        os.close(fd)


def _copy_directory(source_fd: int, target: Path) -> int:
    os.mkdir(target, 0o755)
    os.chmod(target, 0o755)
    total = 0
    for name in sorted(os.listdir(source_fd)):
        info = os.stat(name, dir_fd=source_fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=source_fd), target / name)
            continue
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        if stat.S_ISDIR(info.st_mode):
            fd = os.open(name, flags | os.O_DIRECTORY, dir_fd=source_fd)
            try:
                total += _copy_directory(fd, target / name)
            finally:
                os.close(fd)
        elif stat.S_ISREG(info.st_mode):
            total += _copy_file(os.open(name, flags, dir_fd=source_fd), target / name)
        else:
            raise EnvironmentFailed(f"the build left {name}, which is not a plain file")
    return total


def _copy_file(source_fd: int, target: Path) -> int:
    try:
        info = os.fstat(source_fd)  # what was opened, should the name have been swapped
        if not stat.S_ISREG(info.st_mode):
            raise EnvironmentFailed(f"the build left {target.name}, which is not a plain file")
        mode = 0o755 if info.st_mode & 0o111 else 0o644
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            copied = 0
            while sent := os.sendfile(out, source_fd, copied, 1 << 24):
                copied += sent
            os.fchmod(out, mode)
        finally:
            os.close(out)
        return copied
    finally:
        os.close(source_fd)


def _write_marker(path: Path, text: str) -> None:
    """The completion marker, written last and in one step (renamed into place)."""
    staging = path / f"{MARKER}.{uuid.uuid4().hex}"
    staging.write_text(text)
    os.chmod(staging, 0o644)
    _used(staging)
    os.replace(staging, path / MARKER)


def _used(marker: Path) -> None:
    """Record a use as the marker's modification time, to the nanosecond: the kernel's
    own clock for files ticks in milliseconds, too coarse to order uses in a row."""
    now = time.time_ns()
    os.utime(marker, ns=(now, now))


def _remove(path: Path) -> None:
    """Remove `path` and all in it, whatever modes uv left (it makes some read-only)."""

    def writable(function: Callable[..., object], name: str, _: object) -> None:
        os.chmod(os.path.dirname(name), 0o700)
        function(name)

    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            # Root needs no write permission, and must not chmod by a path a build made.
            shutil.rmtree(path, onerror=None if os.geteuid() == 0 else writable)
        else:
            os.unlink(path)
