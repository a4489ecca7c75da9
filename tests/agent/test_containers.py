"""corral.agent.containers: tasks in containers, run by the machine's podman through the
real launcher (`--container`), as a real Unix account, in a real task cgroup.

The image is laid out here from busybox-static and imported (no registry), and removed
at the end with every container the tests made. Without podman (or root) these skip,
except under CI=true, which installs podman and runs as root."""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from images import busybox_image, need_podman, podman
from livecorral import Accounts, open_folder, wait_until

from corral.agent import cgroups, containers, namespaces
from corral.agent.cgroups import Hierarchy, Limits, TaskCgroup, cleared
from corral.agent.containers import Containers, ImageFailed
from corral.agent.identity import Identity, identity_of
from corral.agent.process import TaskProcess

MIB = 1 << 20


def root_check() -> bytes:
    """A static x86-64 program that exits 1 when its effective uid is root, else 0: a
    setuid-root copy of it says whether setuid gives root (busybox would not tell: it
    drops a setuid bit itself)."""
    code = bytes.fromhex(
        "b86b000000"  # mov eax, 107 (geteuid)
        "0f05"  # syscall
        "31ff"  # xor edi, edi
        "85c0"  # test eax, eax
        "400f94c7"  # sete dil: 1 when root
        "b83c000000"  # mov eax, 60 (exit)
        "0f05"  # syscall
    )
    base, start = 0x400000, 64 + 56
    size = start + len(code)
    header = b"\x7fELF\x02\x01\x01" + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, base + start, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return header + segment + code


@pytest.fixture(scope="module")
def node() -> Containers:
    need_podman()
    found = containers.probe()
    assert found.available, found.reason
    return found


@pytest.fixture(scope="module")
def image(node: Containers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An image of busybox, its applets, and `/bin/rootcheck` setuid root."""
    folder = tmp_path_factory.mktemp("image")
    program = folder / "rootcheck"
    program.write_bytes(root_check())
    with busybox_image(folder, {"bin/rootcheck": (program, 0o4755)}) as name:
        yield name


@pytest.fixture
def hierarchy(tmp_path: Path, node: Containers) -> Iterator[Hierarchy]:
    found = cgroups.find(cgroups.agent_key(tmp_path))
    assert isinstance(found, Hierarchy), found
    found.prepare()
    yield found
    for task in found.tasks():
        task.kill()
        wait_until(lambda task=task: cleared(task), 10, "the test's cgroups to go")
    for path in set(found.parents.values()):
        path.rmdir()
    # runc made the agent's directory in the hierarchies corral does not use, too.
    for root in cgroups.roots():
        with contextlib.suppress(OSError):
            (root / cgroups.PARENT / found.parents["pids"].name).rmdir()


@pytest.fixture
def alice(unix_accounts: Accounts) -> Identity:
    return identity_of(unix_accounts.alice)


@pytest.fixture
def workdir(alice: Identity) -> Iterator[Path]:
    """The task's working directory, the account's own (0700)."""
    with open_folder("corral-ct-", 0o700) as folder:
        os.chown(folder, alice.uid, alice.gid)
        yield folder


@dataclass
class Task:
    process: TaskProcess
    name: str
    log: Path
    cgroup: TaskCgroup

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait(self, timeout: float = 30) -> int:
        ended = wait_until(self.process.ended, timeout, f"container {self.name} to end")
        return int(ended[0])


def start(
    node: Containers,
    image: str,
    hierarchy: Hierarchy,
    alice: Identity,
    workdir: Path,
    tmp_path: Path,
    script: str,
    memory: int = 256 * MIB,
) -> Task:
    """The task `sh -c script` in `image` as the agent would start it: its cgroup made
    with its limits, the launcher told `--container`, `--cgroup` and the log cap."""
    name = f"corral-test-{secrets.token_hex(4)}"
    cgroup = hierarchy.task(name)
    limits = Limits(memory, 0, 256)
    cgroup.create(limits)
    argv, env = containers.task_argv(
        node,
        image,
        ["sh", "-c", script],
        name,
        alice,
        str(workdir),
        [str(workdir)],
        {"PATH": "/bin", "GREETING": "hello from  the host"},
        cgroup,
        limits,
    )
    walls = ["--log-cap", str(MIB), "--cgroup", ":".join(map(str, cgroup.paths()))]
    if namespaces.available() is None:
        walls += ["--namespace", "pid"]
    log = tmp_path / "task.log"
    process = TaskProcess.spawn(
        argv,
        env,
        None,
        log,
        tmp_path / "task.exit",
        launcher_options=("--container", node.podman, *walls),
    )
    return Task(process, name, log, cgroup)


def left(name: str) -> list[str]:
    """The containers of that name podman still knows."""
    found = podman("ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}}")
    return found.stdout.split()


def end(node: Containers, task: Task) -> None:
    """What the agent does once a task's launcher has ended."""
    assert containers.remove(node, task.name, task.cgroup) is None
    wait_until(lambda: cleared(task.cgroup), 10, "the task's cgroup to go")


def test_probe_says_what_runs_containers(node: Containers) -> None:
    assert node.runtime in containers.RUNTIMES
    assert node.describe().startswith(f"containers: podman {node.version} with {node.runtime}")
    # What an agent says at its start without starting a container is what starting one
    # finds here.
    assert containers.look() == node


def test_runs_as_the_account_and_setuid_gives_no_root(
    node: Containers,
    image: str,
    hierarchy: Hierarchy,
    alice: Identity,
    workdir: Path,
    tmp_path: Path,
) -> None:
    if platform.machine() != "x86_64":
        pytest.skip("the setuid test program is x86-64 code")
    script = (
        'echo "uid $(id -u) gid $(id -g) groups $(id -G)"; echo "env [$GREETING]"; '
        '/bin/rootcheck; echo "setuid-root $?"; pwd; touch made-inside; '
        "touch /bin/x 2>/dev/null || echo image-read-only"
    )
    task = start(node, image, hierarchy, alice, workdir, tmp_path, script)
    assert task.wait() == 0, task.output()
    out = task.output()
    assert f"uid {alice.uid} gid {alice.gid} groups " in out, out
    groups = out.split("groups ", 1)[1].splitlines()[0].split()
    assert sorted(map(int, groups)) == sorted(set(alice.groups)), out
    assert "env [hello from  the host]" in out, out
    assert "setuid-root 0" in out, out
    assert str(workdir) in out.splitlines(), out
    assert (workdir / "made-inside").stat().st_uid == alice.uid
    assert "image-read-only" in out, out
    end(node, task)
    assert left(task.name) == []
    # The same program, setuid root on the host and without no-new-privileges, gives root:
    # the test tells.
    program = tmp_path / "rootcheck"
    program.write_bytes(root_check())
    program.chmod(0o4755)
    tmp_path.chmod(0o755)
    check = subprocess.run(["setpriv", "--reuid", str(alice.uid), "--clear-groups", program])
    assert check.returncode == 1


@pytest.mark.parametrize("code", [0, 3])
def test_sigterm_reaches_the_container_which_checkpoints_and_exits_with_its_code(
    node: Containers,
    image: str,
    hierarchy: Hierarchy,
    alice: Identity,
    workdir: Path,
    tmp_path: Path,
    code: int,
) -> None:
    checkpoint = workdir / "checkpoint"
    script = (
        f'trap "echo saved > {checkpoint}; echo checkpointed; exit {code}" TERM; '
        "echo started; while :; do sleep 0.1; done"
    )
    task = start(node, image, hierarchy, alice, workdir, tmp_path, script)
    wait_until(lambda: "started" in task.output(), 30, "the container to start")
    asked = time.monotonic()
    task.process.signal(signal.SIGTERM)
    assert task.wait(10) == code, task.output()
    assert time.monotonic() - asked < 5  # well within a grace period
    assert checkpoint.is_file(), task.output()
    assert checkpoint.read_text() == "saved\n"
    assert checkpoint.stat().st_uid == alice.uid
    assert "started" in task.output() and "checkpointed" in task.output()
    # podman run removed its container itself (--rm); remove() finds nothing to do.
    wait_until(lambda: left(task.name) == [], 10, "podman to forget the container")
    end(node, task)


def test_a_killed_group_leaves_no_container_once_removed(
    node: Containers,
    image: str,
    hierarchy: Hierarchy,
    alice: Identity,
    workdir: Path,
    tmp_path: Path,
) -> None:
    script = 'trap "" TERM; echo started; while :; do sleep 0.1; done'
    task = start(node, image, hierarchy, alice, workdir, tmp_path, script)
    wait_until(lambda: "started" in task.output(), 30, "the container to start")
    task.process.signal(signal.SIGKILL)
    assert task.wait(10) == 128 + signal.SIGKILL
    assert containers.remove(node, task.name, task.cgroup) is None
    assert left(task.name) == []
    wait_until(lambda: cleared(task.cgroup), 10, "the task's cgroup to go")
    for root in cgroups.roots():
        assert not (root / containers.cgroup_parent(task.cgroup).lstrip("/")).exists()


def test_the_container_shares_the_hosts_network(
    node: Containers,
    image: str,
    hierarchy: Hierarchy,
    alice: Identity,
    workdir: Path,
    tmp_path: Path,
) -> None:
    (workdir / "hello.txt").write_text("hello from the container\n")
    os.chown(workdir / "hello.txt", alice.uid, alice.gid)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = f"echo listening; exec httpd -f -p 127.0.0.1:{port} -h {workdir}"
    task = start(node, image, hierarchy, alice, workdir, tmp_path, script)
    try:

        def fetch() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=2) as r:
                    return str(r.read().decode())
            except OSError:
                return None

        assert wait_until(fetch, 30, "the container's listener") == "hello from the container\n"
    finally:
        task.process.signal(signal.SIGTERM)
        task.wait(10)
    end(node, task)


def test_the_container_is_in_the_task_cgroup_and_its_memory_limit_holds(
    node: Containers,
    image: str,
    hierarchy: Hierarchy,
    alice: Identity,
    workdir: Path,
    tmp_path: Path,
) -> None:
    script = 'echo ready; sleep 2; head -c 400000000 /dev/zero | sort > /dev/null; echo "sort $?"'
    task = start(node, image, hierarchy, alice, workdir, tmp_path, script, memory=64 * MIB)
    wait_until(lambda: "ready" in task.output(), 30, "the container to start")
    inspected = podman("inspect", "--format", "{{.State.Pid}}", task.name)
    pid = int(inspected.stdout.strip())
    assert pid in task.cgroup.processes()
    placed = Path(f"/proc/{pid}/cgroup").read_text()
    below = containers.cgroup_parent(task.cgroup) + "/libpod-"
    for controller in ("memory", "pids", "cpu"):
        line = next(x for x in placed.splitlines() if controller in x.split(":")[1].split(","))
        assert line.split(":", 2)[2].startswith(below), placed
    # sort holds its one line of 400 MB, and the kernel kills it at the task's 64 MiB.
    assert task.wait(60) == 0, task.output()
    assert f"sort {128 + signal.SIGKILL}" in task.output()
    end(node, task)


def test_a_missing_image_fails_with_podmans_message(node: Containers) -> None:
    missing = f"localhost/corral-missing-{secrets.token_hex(3)}:latest"
    with pytest.raises(ImageFailed) as failed:
        containers.ensure_image(node, missing)
    assert failed.value.image == missing
    assert failed.value.message and "\n" not in failed.value.message
    assert "Error:" not in failed.value.message
    with pytest.raises(ImageFailed, match="not an image reference"):
        containers.ensure_image(node, "--privileged")


def test_an_image_present_needs_no_pull(node: Containers, image: str) -> None:
    containers.ensure_image(node, image)  # no registry: a pull would fail


def test_what_cannot_reach_a_container_is_refused(node: Containers, alice: Identity) -> None:
    def command(**changed: object) -> None:
        given: dict[str, object] = {
            "image": "localhost/x",
            "command": ["true"],
            "name": "corral-x",
            "uid": alice.uid,
            "gid": alice.gid,
            "groups": alice.groups,
            "workdir": "/tmp",
            "mounts": [("/tmp", "/tmp")],
            "env": {},
            "cgroup_parent": None,
            "memory": None,
            "pids": None,
        }
        given.update(changed)
        containers.container_command(node, **given)  # type: ignore[arg-type]

    command()
    for bad in (
        {"env": {"A": "two\nlines"}},
        {"env": {"#A": "x"}},
        {"image": "-v/:/host"},
        {"name": "bad name"},
        {"mounts": [("/data", "/elsewhere")]},
        {"mounts": [("/a,b", "/a,b")]},
        {"workdir": "relative"},
        {"workdir": "/etc"},
    ):
        with pytest.raises(ValueError):
            command(**bad)
    assert containers.env_file({"B": " x=1 ", "A": ""}) == b"A=\nB= x=1 \n"
    off = Containers(False, "podman is not installed")
    assert off.describe() == "containers: off (podman is not installed)"
    assert containers.remove(off, "corral-x") is None
