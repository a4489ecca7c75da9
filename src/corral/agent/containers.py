"""Tasks in OCI containers (`corral submit --image`), run by a rootful podman on the node.

The agent starts a container task as it starts any other: through its launcher
(corral.agent.launch), in the task's process group and cgroup, with the log cap. Only the
command differs: it is `podman run` (`task_argv`), and the launcher is told so
(`--container PODMAN`), so that it keeps root for it: podman must be root to run the
container's processes as the task's account, which it then does itself (`--user`).

What the container gets, and why:

- The task's account inside (uid, gid and its groups), no capabilities, and
  `no-new-privileges`: a setuid binary in a user's image gives nothing.
- A read-only image (`--read-only`): the account could write little of an image anyway
  (its files are root's), and what it could write would land in podman's storage on the
  node's disk, where no limit holds it and a full disk fails every task of the node. /tmp,
  /var/tmp and /run are tmpfs (podman's default with `--read-only`), and /dev/shm is as
  large as the task's memory: their pages count against the task's memory limit. Output
  belongs in the working directory, which is mounted.
- The working directory and each mount at the same path inside, so that paths mean the
  same inside and out (checkpoints, data, CORRAL_* variables naming files).
- The host's network (`--network host`): a gang's ranks reach MASTER_ADDR:MASTER_PORT,
  and the ports a task is given are the host's, walled as any task's (by its uid).
- podman's init as process 1 (`--init`): a program as process 1 would not get the SIGTERM
  it has no handler for; the init passes signals on and exits with the command's code.
  `podman run` itself (attached, no TTY) passes the agent's SIGTERM to the container
  and exits with the container's exit code.
- Output straight into the launcher's pipe (`--log-driver passthrough`): the log cap holds,
  and podman keeps no copy of its own on the node's disk.
- The environment through an env file that podman reads from its standard input, which the
  launcher fills from the environment the agent gives it (`env_file`): never on a command
  line (every account may read those), never in a file on disk (the data directory holds
  no secret), and never in podman's own environment (a root process, which LD_PRELOAD or
  PATH would change).
- Its cgroup below the task's (`--cgroup-parent`, podman's cgroupfs manager; conmon stays
  in the task's cgroup itself, `--cgroups no-conmon`): the task's memory, CPU, pids and
  device limits hold for everything the container runs, and the agent finds and kills it
  there (corral.agent.cgroups counts the cgroups below a task's as the task's). The
  container's own cgroup then gets no limit of its own: a memory limit met there would be
  counted there, not in the task's cgroup where the agent looks for it. (On cgroup v1 the
  kernel counts an OOM kill in the victim's own cgroup, which podman removes when the
  container ends: the task's limit holds, but its end reads as a kill (137), not as "out
  of memory". v2 counts it in the task's cgroup too.)

A SIGKILL of the launcher's group kills `podman run` but neither conmon (which left the
group) nor the container: the agent kills what is in the task's cgroup, and `remove()`
tells podman to forget the container and removes the cgroups it made.

The node's podman, runtime and limits are found once, at agent start (`probe`), by
starting a real container from a one-file image made on the spot.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import resource
import secrets
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.agent import cgroups
from corral.agent.cgroups import Limits, TaskCgroup
from corral.agent.identity import Identity

# podman's own PATH: root-owned system directories only (it keeps root; runc is in sbin).
PODMAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Tried in this order; crun refuses a cgroup v1 hierarchy that has v2 beside it (hybrid).
RUNTIMES = ("runc", "crun")
# The start of the names of the images and containers probes make and remove again, each
# its own (two agents of one node may probe at once, and must not remove each other's).
PROBE_PREFIX = "corral-probe-"
# A static program for the probe's image, and its arguments for a run that exits 0: the
# init podman's `--init` needs is one (static in Debian's catatonit), busybox another.
PROBE_PROGRAMS = (
    ("/usr/libexec/podman/catatonit", ("--version",)),
    ("/usr/bin/catatonit", ("--version",)),
    ("/bin/busybox", ("true",)),
)
# The least limits tried when neither podman's defaults nor the agent's own start a
# container (a node whose root cannot raise them: no CAP_SYS_RESOURCE).
FLOOR = 1024
# podman's calls other than a pull: seconds before they count as failed.
PODMAN_TIMEOUT = 120.0
PULL_TIMEOUT = 1800.0
# What an image reference may hold: never a leading "-" (podman would read an option).
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
NAME_UNFIT = re.compile(r"[^A-Za-z0-9_.-]")

__all__ = [
    "Containers",
    "ImageFailed",
    "Ulimit",
    "container_command",
    "container_name",
    "ensure_image",
    "env_file",
    "look",
    "probe",
    "remove",
    "task_argv",
]


class ImageFailed(Exception):
    """An image is neither on the node nor could it be pulled; `message` is podman's."""

    def __init__(self, image: str, message: str) -> None:
        super().__init__(f"image {image!r}: {message}")
        self.image = image
        self.message = message


@dataclass(frozen=True, slots=True)
class Ulimit:
    """A resource limit podman sets in the container (`--ulimit NAME=SOFT:HARD`)."""

    name: str
    soft: int
    hard: int

    def option(self) -> str:
        return f"{self.name}={self.soft}:{self.hard}"


@dataclass(frozen=True, slots=True)
class Containers:
    """What runs containers on this node: podman (its path and version), the OCI runtime
    and the ulimits with which a container starts (none: podman's defaults). When not
    `available`, `reason` says why."""

    available: bool
    reason: str = ""
    podman: str = ""
    version: str = ""
    runtime: str = ""
    ulimits: tuple[Ulimit, ...] = ()

    def describe(self) -> str:
        """One line for `corral up` and `corral nodes`."""
        if not self.available:
            return f"containers: off ({self.reason})"
        limits = ", ".join(f"{u.name} {u.hard}" for u in self.ulimits)
        shown = f" (ulimits {limits})" if limits else ""
        return f"containers: podman {self.version} with {self.runtime}{shown}"

    def podman_options(self) -> list[str]:
        """podman and its global options, before `run`, `rm` or `image`."""
        return [self.podman, "--runtime", self.runtime, "--cgroup-manager", "cgroupfs"]


def _podman(
    argv: Sequence[str], timeout: float = PODMAN_TIMEOUT, given: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """Run podman with its own minimal environment; a timeout is a failure (code 124)."""
    try:
        done = subprocess.run(
            list(argv),
            input=given,
            capture_output=True,
            env={"PATH": PODMAN_PATH},
            cwd="/",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"no answer in {timeout:.0f} s")
    return subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )


def _said(done: subprocess.CompletedProcess[str], limit: int = 400) -> str:
    """What podman said of a failure: its last error (else its last line), without
    "Error: ", within `limit`; not the warnings of its retries before it."""
    lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    text = (errors or lines or [""])[-1].removeprefix("Error: ")
    text = text or f"podman exited with {done.returncode}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- what works on this node ----------------------------------------------------------------


def look() -> Containers:
    """Whether containers may run here, without starting one (a few milliseconds, so an
    agent says it when it starts): root, podman that answers, an OCI runtime; with the
    ulimits a container most likely takes (the agent's own, nproc capped at the kernel's
    pid_max). `probe` starts one to be sure, before the node's first task in an image.
    Never raises."""
    found = _prerequisites()
    if isinstance(found, Containers):
        return found
    podman, version, runtimes = found
    return Containers(True, "", podman, version, runtimes[0], _ulimit_choices()[1])


def _prerequisites() -> Containers | tuple[str, str, list[str]]:
    """podman, its version and the runtimes it may use; or, as unavailable, why not."""
    if os.geteuid() != 0:
        return Containers(False, "corral does not run as root, and podman must (rootful)")
    podman = shutil.which("podman", path=PODMAN_PATH)
    if podman is None:
        return Containers(False, "podman is not installed")
    version = _podman([podman, "version", "--format", "{{.Client.Version}}"])
    if version.returncode != 0:
        return Containers(False, f"podman does not answer: {_said(version)}")
    runtimes = [name for name in RUNTIMES if shutil.which(name, path=PODMAN_PATH)]
    if not runtimes:
        return Containers(False, f"no OCI runtime ({' nor '.join(RUNTIMES)}) is installed")
    return podman, version.stdout.strip(), runtimes


def probe() -> Containers:
    """Find what runs containers here, by starting one: podman, the first runtime with
    which a container starts, and the first set of ulimits it accepts (podman's defaults;
    the agent's own, which a task outside a container would have; then FLOOR). The probe's
    image is made from a single static program and removed again, with what probes of
    processes that have ended left behind. Never raises."""
    found = _prerequisites()
    if isinstance(found, Containers):
        return found
    podman, version, runtimes = found
    _remove_stale_probes(podman)
    program = next(((p, a) for p, a in PROBE_PROGRAMS if _static(Path(p))), None)
    if program is None:
        return Containers(False, "no static program for a probe's image (catatonit, busybox)")
    # The probing process's pid in its names: a probe killed half-way leaves them, and a
    # later one removes them once that process has gone.
    name = f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="corral-probe-") as folder:
        made = _import_probe(podman, Path(folder), Path(program[0]), f"localhost/{name}:latest")
        if made is not None:
            return Containers(False, f"podman cannot import an image: {made}")
        try:
            return _first_that_starts(podman, version, runtimes, program[1], name)
        finally:
            _podman([podman, "rmi", "--force", f"localhost/{name}:latest"])


def _remove_stale_probes(podman: str) -> None:
    """Remove the containers and images of probes whose process has ended."""
    for kind, listing in (
        ("container", [podman, "ps", "--all", "--format", "{{.Names}}"]),
        ("image", [podman, "images", "--format", "{{.Repository}}"]),
    ):
        for found in _podman(listing).stdout.split():
            short = found.removeprefix("localhost/")
            owner = short.removeprefix(PROBE_PREFIX).split("-")[0]
            if short.startswith(PROBE_PREFIX) and owner.isdigit() and not _runs(int(owner)):
                _podman([podman, "rm" if kind == "container" else "rmi", "--force", found])


def _runs(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _first_that_starts(
    podman: str, version: str, runtimes: list[str], arguments: Sequence[str], name: str
) -> Containers:
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="corral-probe-") as workdir:
        os.chmod(workdir, 0o755)
        for runtime in runtimes:
            for ulimits in _ulimit_choices():
                found = Containers(True, "", podman, version, runtime, ulimits)
                argv, env = container_command(
                    found,
                    image=f"localhost/{name}:latest",
                    command=["/probe", *arguments],
                    name=name,
                    uid=65534,
                    gid=65534,
                    groups=(),
                    workdir=workdir,
                    mounts=[(workdir, workdir)],
                    env={"PATH": "/"},
                    cgroup_parent=None,
                    memory=64 << 20,
                    pids=64,
                )
                done = _podman(argv, given=env_file(env))
                if done.returncode == 0:
                    return found
                failures.append(f"{runtime}: {_said(done, 200)}")
    # The last failure of each runtime says the most (its least demanding try).
    last = {failure.split(":", 1)[0]: failure for failure in failures}
    return Containers(False, "no container starts: " + "; ".join(last.values()), podman, version)


def _ulimit_choices() -> list[tuple[Ulimit, ...]]:
    """podman's defaults, the agent's own limits, then FLOOR. RLIMIT_NPROC is capped at
    the kernel's pid_max, above which it changes nothing (and podman lowers its own)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    cap = _pid_max()
    own = (
        Ulimit("nofile", *_finite(nofile, None)),
        Ulimit("nproc", *_finite(nproc, cap)),
    )
    floor = (Ulimit("nofile", FLOOR, FLOOR), Ulimit("nproc", FLOOR, FLOOR))
    return [(), own, floor]


def _finite(limits: tuple[int, int], cap: int | None) -> tuple[int, int]:
    """A (soft, hard) pair in numbers podman takes: unlimited is `cap`, or 2**20 (the
    kernel's default nr_open) when there is none; nothing above `cap`."""
    big = cap if cap is not None else 1 << 20
    soft, hard = (big if value == resource.RLIM_INFINITY else value for value in limits)
    if cap is not None:
        soft, hard = min(soft, cap), min(hard, cap)
    return soft, hard


def _pid_max() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return None


def _static(path: Path) -> bool:
    """Whether `path` is an ELF executable that needs no loader (no PT_INTERP segment),
    so that it runs in an image that holds nothing else. 64-bit little-endian only."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(64)
            if len(header) < 64 or header[:6] != b"\x7fELF\x02\x01":
                return False
            offset = int.from_bytes(header[32:40], "little")
            size = int.from_bytes(header[54:56], "little")
            count = int.from_bytes(header[56:58], "little")
            handle.seek(offset)
            table = handle.read(size * count)
    except OSError:
        return False
    kinds = (int.from_bytes(table[i * size : i * size + 4], "little") for i in range(count))
    return 3 not in kinds  # PT_INTERP


def _import_probe(podman: str, folder: Path, program: Path, image: str) -> str | None:
    """Import the probe's image (/probe: `program`, and an empty /tmp); why not, or None."""
    archive = folder / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        # The program itself, not a symlink to it (catatonit is one).
        tar.add(program.resolve(), arcname="probe", recursive=False)
        entry = tarfile.TarInfo("tmp")
        entry.type, entry.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(entry)
        # A content of its own: images of equal content are one image to podman, and a
        # probe that removes its own would remove another's at the same time.
        mark = secrets.token_hex(16).encode()
        entry = tarfile.TarInfo("probe-id")
        entry.size = len(mark)
        tar.addfile(entry, io.BytesIO(mark))
    done = _podman([podman, "import", "--quiet", str(archive), image])
    return None if done.returncode == 0 else _said(done)


# -- images -----------------------------------------------------------------------------


def check_image(image: str) -> None:
    """ValueError unless `image` reads as an image reference (and never as an option)."""
    if not IMAGE.fullmatch(image):
        raise ValueError(f"{image!r} is not an image reference")


def ensure_image(containers: Containers, image: str, timeout: float = PULL_TIMEOUT) -> None:
    """Make sure `image` is on this node: present already, or pulled now (once: a second
    call finds it). ImageFailed with podman's message when the lookup or the pull fails;
    a task's `podman run` never pulls (`--pull never`)."""
    if not containers.available:
        raise ImageFailed(image, f"containers are off on this node: {containers.reason}")
    try:
        check_image(image)
    except ValueError as error:
        raise ImageFailed(image, str(error)) from None
    base = containers.podman_options()
    found = _podman([*base, "image", "exists", image])
    if found.returncode == 0:
        return
    if found.returncode != 1:  # 1: absent; anything else, podman failed to look
        raise ImageFailed(image, _said(found))
    pulled = _podman([*base, "pull", "--quiet", image], timeout=timeout)
    if pulled.returncode != 0:
        raise ImageFailed(image, _said(pulled))


# -- a task's container ---------------------------------------------------------------------


def container_name(agent: str, label: str) -> str:
    """The container's name for the task cgroup `label` (corral.agent.cgroups.task_name) of
    the agent `agent` (its key): deterministic, so the agent finds it again to remove it,
    and distinct per agent, since two agents of a node share podman."""
    return f"corral-{agent}-{NAME_UNFIT.sub('_', label)}"


def cgroup_parent(cgroup: TaskCgroup) -> str:
    """The task cgroup's path below each hierarchy's root (/corral/AGENT/TASK), as
    podman's `--cgroup-parent` takes it."""
    return "/" + "/".join(cgroup.dirs["pids"].parts[-3:])


def env_file(env: Mapping[str, str]) -> bytes:
    """`env` as podman's env file: a NAME=VALUE line each, taken verbatim. ValueError for
    what that file cannot carry: a line break, or a name podman would read otherwise."""
    lines = []
    for name, value in sorted(env.items()):
        if not name or "=" in name or name[0] == "#" or name[0].isspace():
            raise ValueError(f"the environment variable name {name!r} cannot reach a container")
        if any(c in name + value for c in "\n\r\0"):
            raise ValueError(f"the environment variable {name} holds a line break or NUL")
        lines.append(f"{name}={value}\n")
    return "".join(lines).encode()


def _mount(path: str) -> list[str]:
    """A bind mount of `path` at the same path inside; ValueError for a path podman's
    `--mount` cannot carry."""
    if not os.path.isabs(path) or any(c in path for c in ",\n\r\0"):
        raise ValueError(f"{path!r} cannot be mounted in a container (absolute, no comma)")
    return ["--mount", f"type=bind,source={path},destination={path}"]


def container_command(
    containers: Containers,
    *,
    image: str,
    command: Sequence[str],
    name: str,
    uid: int,
    gid: int,
    groups: Sequence[int],
    workdir: str,
    mounts: Sequence[tuple[str, str]],
    env: Mapping[str, str],
    cgroup_parent: str | None,
    memory: int | None,
    pids: int | None,
    devices: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The `podman run` of `command` (the image's own when empty) in `image`, and the
    environment to hand the launcher, which gives it to the container (see `env_file`).
    Mounts are (source, destination) pairs, and must be the same path; the container
    starts in `workdir`, which must be in one of them (it is not mounted itself: a path
    below a mount is resolved inside the container, where a link an account planted leads
    into the image, never to a host path root could reach and the account could not).
    `devices` are CDI names of the task's GPUs (nvidia.com/gpu=N). With
    `cgroup_parent` (see `cgroup_parent()`), the container's cgroup is below the task's,
    whose limits hold; without, the container's own cgroup gets `memory` and `pids`.
    ValueError for what cannot run in a container (see the module's docstring)."""
    if not containers.available:
        raise ValueError(f"containers are off on this node: {containers.reason}")
    check_image(image)
    if NAME_UNFIT.search(name) or not name[:1].isalnum():
        raise ValueError(f"{name!r} is not a container name")
    env_file(env)
    argv = [*containers.podman_options(), "run", "--rm", "--name", name, "--pull", "never"]
    argv += ["--init", "--network", "host", "--log-driver", "passthrough"]
    argv += ["--user", f"{uid}:{gid}"]
    for group in dict.fromkeys(groups):
        if group != gid:
            argv += ["--group-add", str(group)]
    argv += ["--cap-drop", "all", "--security-opt", "no-new-privileges", "--read-only"]
    for source, destination in mounts:
        if source != destination:
            raise ValueError(f"{source!r} must be mounted at the same path, not {destination!r}")
        argv += _mount(source)
    sources = [Path(source) for source, _ in mounts]
    inside = Path(workdir)
    if not inside.is_absolute() or not any(inside.is_relative_to(s) for s in sources):
        raise ValueError(f"{workdir!r} is not in a directory mounted in the container")
    argv += ["--workdir", workdir]
    for device in devices:
        argv += ["--device", device]
    for ulimit in containers.ulimits:
        argv += ["--ulimit", ulimit.option()]
    argv += ["--cgroups", "no-conmon"]
    if cgroup_parent is not None:
        argv += ["--cgroup-parent", cgroup_parent, "--pids-limit", "-1"]
    else:
        if memory is not None:
            argv += ["--memory", str(memory), "--memory-swap", str(memory)]
        argv += ["--pids-limit", str(pids) if pids is not None else "-1"]
    if memory is not None:
        argv += ["--shm-size", str(memory)]
    argv += ["--env-file", "/dev/stdin", "--", image, *command]
    return argv, dict(env)


def task_argv(
    containers: Containers,
    image: str,
    command: Sequence[str],
    name: str,
    identity: Identity,
    workdir: str,
    mounts: Sequence[str],
    env: Mapping[str, str],
    cgroup: TaskCgroup | None,
    limits: Limits | None,
    devices: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """For the agent: the argv and environment of a container task, as `container_command`
    gives them, for the account `identity`, the task's cgroup (None: limits are off) and
    its `limits`. Start it with TaskProcess.spawn(argv, env, None, ..., user=None,
    launcher_options=(..., "--container", containers.podman)); after it ended (or was
    killed), call `remove()`. ValueError for what cannot run in a container."""
    return container_command(
        containers,
        image=image,
        command=command,
        name=name,
        uid=identity.uid,
        gid=identity.gid,
        groups=identity.groups,
        workdir=workdir,
        mounts=[(path, path) for path in mounts],
        env=env,
        cgroup_parent=cgroup_parent(cgroup) if cgroup is not None else None,
        memory=limits.memory if limits is not None else None,
        pids=limits.pids if limits is not None else None,
        devices=devices,
    )


def remove(containers: Containers, name: str, cgroup: TaskCgroup | None = None) -> str | None:
    """Make sure the container `name` is gone: killed if it still runs (its `podman run`
    was killed), and forgotten by podman. With the task's `cgroup`, also the cgroups podman
    made below it, and the task's directory in the hierarchies corral does not use (runc
    joins every one). Fine when there is no such container. Why it failed, or None."""
    if not containers.available:
        return None
    base = containers.podman_options()
    # Once: a container whose processes died with its launcher's process namespace is
    # still running to podman, which fails to kill it ("state improper: stopped") but
    # learns that it stopped, and removes it the second time.
    for _ in range(2):
        done = _podman([*base, "rm", "--force", "--ignore", "--time", "0", name])
        if done.returncode == 0:
            break
    if cgroup is not None:
        _remove_cgroups(cgroup)
    if done.returncode == 0 or _podman([*base, "container", "exists", name]).returncode == 1:
        return None
    return _said(done)


def _remove_cgroups(cgroup: TaskCgroup) -> None:
    """rmdir the (empty) cgroups below the task's in every hierarchy, then the task's own
    where corral keeps none; the agent removes its own once it has read them."""
    relative = cgroup_parent(cgroup).lstrip("/")
    own = set(cgroup.dirs.values())
    for root in cgroups.roots():
        top = root / relative
        if not top.is_dir():
            continue
        below = sorted((Path(d) for d, _, _ in os.walk(top) if Path(d) != top), reverse=True)
        for path in below + ([] if top in own else [top]):
            with contextlib.suppress(OSError):
                path.rmdir()
