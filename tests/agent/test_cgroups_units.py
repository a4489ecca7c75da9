"""corral.agent.cgroups: cgroup v2 against a tree laid out in a temporary directory (what
the kernel would show, with real processes where processes matter), and the machine's
own cgroups (v1 here) with real processes, as root. Without root these skip, except
under CI=true, which runs as root."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import running, wait_until

from corral.agent import cgroups
from corral.agent.cgroups import Hierarchy, Limits, TaskCgroup, cleared
from corral.agent.walls import out_of_memory

ROOT = os.geteuid() == 0
MIB = 1 << 20


def need_root() -> None:
    if not ROOT:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root, and these tests need the machine's cgroups")
        pytest.skip("cgroups need root")


# -- v2, on a tree the test lays out ------------------------------------------------------


def v2_tree(root: Path, key: str) -> Path:
    """A cgroup2 mount's root with the controllers corral needs, and the directories the
    kernel would fill with interface files as corral makes them."""
    for level in (root, root / "corral", root / "corral" / key):
        level.mkdir(parents=True, exist_ok=True)
        (level / "cgroup.subtree_control").write_text("cpu\n" if level == root else "")
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma\n")
    return root


def test_find_takes_a_v2_tree_that_has_the_controllers(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "unified", "k")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "33 24 0:28 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n"
        f"35 24 0:30 / {root} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n"
    )
    found = cgroups.find("k", mountinfo)
    assert isinstance(found, Hierarchy) and found.version == 2, found
    assert set(found.parents.values()) == {root / "corral" / "k"}


def test_find_takes_v1_controllers_where_each_is_mounted(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    hybrid = (
        "25 24 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "26 24 0:24 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "27 24 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "28 24 0:26 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
        "29 24 0:27 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n"
    )
    # The unified mount has no cgroup.controllers here: v2 is not usable.
    mountinfo.write_text(hybrid)
    found = cgroups.find("k", mountinfo)
    assert isinstance(found, Hierarchy) and found.version == 1, found
    assert found.parents == {
        "memory": Path("/sys/fs/cgroup/memory/corral/k"),
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct/corral/k"),
        "pids": Path("/sys/fs/cgroup/pids/corral/k"),
        "freezer": Path("/sys/fs/cgroup/freezer/corral/k"),
    }
    mountinfo.write_text("\n".join(hybrid.splitlines()[:3]))
    assert cgroups.find("k", mountinfo) == "no cgroup controller pids (v1) nor a v2 tree with them"


def test_v2_hands_the_controllers_down_and_writes_the_limits(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, "k")
    hierarchy = Hierarchy.v2(root, "k")
    hierarchy.prepare()
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids\n"
    for level in (root / "corral", root / "corral" / "k"):
        assert (level / "cgroup.subtree_control").read_text() == "+memory +cpu +pids\n"
    task = hierarchy.task("train.7.task-0.launch-3")
    task.dirs["memory"].mkdir()
    (task.dirs["memory"] / "memory.swap.max").write_text("max\n")
    task.create(Limits(memory=512 * MIB, cpu=1.5, pids=100, denied=(1, 2)))
    assert task.paths() == [root / "corral" / "k" / "train.7.task-0.launch-3"]
    folder = task.paths()[0]
    written = {name: (folder / name).read_text() for name in os.listdir(folder)}
    assert written == {
        "memory.max": f"{512 * MIB}\n",
        "memory.swap.max": "0\n",
        "cpu.max": "150000 100000\n",
        "pids.max": "100\n",
    }
    task.create(Limits(memory=MIB, cpu=0, pids=1))
    assert (folder / "cpu.max").read_text() == "max 100000\n"


def test_v2_reads_an_oom_kill_and_the_limit_as_people_write_it(tmp_path: Path) -> None:
    task = TaskCgroup(2, "t", dict.fromkeys(cgroups.REQUIRED, tmp_path))
    (tmp_path / "memory.max").write_text(f"{512 * MIB}\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 0\n")
    assert out_of_memory(task) is None
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    assert out_of_memory(task) == "out of memory: limit 512 MiB"


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()


def test_v2_kills_with_cgroup_kill_or_frozen_what_its_procs_list(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    task = TaskCgroup(2, "t", dict.fromkeys(cgroups.REQUIRED, tmp_path))
    (tmp_path / "cgroup.kill").write_text("0\n")
    task.kill()
    assert (tmp_path / "cgroup.kill").read_text() == "1\n"
    # A kernel before cgroup.kill: what cgroup.procs lists is killed while frozen.
    (tmp_path / "cgroup.kill").unlink()
    sleepers.extend(subprocess.Popen(["sleep", "60"]) for _ in range(3))
    (tmp_path / "cgroup.procs").write_text("".join(f"{p.pid}\n" for p in sleepers))
    assert task.processes() == {p.pid for p in sleepers}
    task.kill()
    assert [p.wait(timeout=10) for p in sleepers] == [-signal.SIGKILL] * 3
    assert (tmp_path / "cgroup.freeze").read_text() == "0\n"  # thawed again


# -- the machine's own cgroups, with real processes ------------------------------------------


@pytest.fixture
def hierarchy(tmp_path: Path) -> Iterator[Hierarchy]:
    need_root()
    found = cgroups.find(cgroups.agent_key(tmp_path))
    assert isinstance(found, Hierarchy), found
    found.prepare()
    yield found
    for task in found.tasks():
        task.kill()
        wait_until(lambda task=task: cleared(task), 10, "the test's cgroups to go")
    for path in set(found.parents.values()):
        path.rmdir()


def launch(task: TaskCgroup, tmp_path: Path, script: str) -> subprocess.Popen[bytes]:
    """corral's launcher of `sh -c script`, told to enter `task` first."""
    paths = ":".join(str(path) for path in task.paths())
    options = ["--cgroup", paths, "--exit-file", str(tmp_path / "task.exit")]
    process = subprocess.Popen(
        [sys.executable, "-I", "-m", "corral.agent.launch", *options, "--", "sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdin is not None
    with process.stdin:
        process.stdin.write(json.dumps({"PATH": "/usr/bin:/bin"}).encode())
    return process


def test_the_launcher_and_all_it_starts_are_in_the_task_cgroup_and_die_with_it(
    hierarchy: Hierarchy, tmp_path: Path
) -> None:
    task = hierarchy.task("leaver.1.task-0.launch-1")
    task.create(Limits(memory=256 * MIB, cpu=0.5, pids=32))
    if task.version == 1:
        assert (task.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (task.dirs["pids"] / "pids.max").read_text().strip() == "32"
        limit = (task.dirs["memory"] / "memory.limit_in_bytes").read_text().strip()
        assert limit == str(256 * MIB)
    process = launch(task, tmp_path, "setsid sleep 300 & echo $!; exec sleep 300")
    assert process.stdout is not None
    escaped = int(process.stdout.readline())
    members = task.processes()
    assert {process.pid, escaped} <= members and len(members) == 3, members
    assert not cleared(task)  # killed, not gone yet
    wait_until(lambda: cleared(task), 10, "the cgroup to empty and go")
    assert process.wait(timeout=10) == -signal.SIGKILL and not running(escaped)
    assert not any(path.exists() for path in task.paths())


def test_a_fork_burst_meets_the_pids_limit_and_is_killed_whole(
    hierarchy: Hierarchy, tmp_path: Path
) -> None:
    task = hierarchy.task("burst.1.task-0.launch-1")
    task.create(Limits(memory=256 * MIB, cpu=0, pids=16))
    launcher = launch(task, tmp_path, "while :; do sleep 30 & done")
    # The shell stops at its first refused fork: 14 sleeps beside it and its launcher.
    assert launcher.wait(timeout=20) == 2
    assert (tmp_path / "task.exit").read_text() == "2\n"
    assert len(task.processes()) == 14
    wait_until(lambda: cleared(task), 10, "the sleeps it left to be killed")


def test_a_task_cgroup_is_found_again_by_its_name_only(hierarchy: Hierarchy) -> None:
    task = hierarchy.task("a.1.task-2.launch-9")
    task.create(Limits(memory=64 * MIB, cpu=0, pids=8))
    assert [found.name for found in hierarchy.tasks()] == [task.name]
    given = [str(path) for path in task.paths()]
    owned = hierarchy.owned(given)
    assert owned is not None and owned.name == task.name
    assert hierarchy.owned(["/sys/fs/cgroup/memory", "/tmp/x/y"]) is None
    assert cleared(task)
