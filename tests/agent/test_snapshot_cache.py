"""corral.agent.snapshots on real files, processes and Unix accounts: a digest is unpacked
once per node, refused when its bytes are not what it names, redone after a crash, copied
for a task as the task's account without following what was planted, and pruned by last
use."""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from livecorral import Accounts, open_folder

from corral.agent.snapshots import SnapshotCache
from corral.sdk.snapshot import Snapshot, pack


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def snapshot_of(folder: Path, files: dict[str, str]) -> Snapshot:
    write(folder, files)
    return pack(folder)


@pytest.fixture
def code(tmp_path: Path) -> Snapshot:
    """train.py, pkg/util.py and run, a symlink to train.py."""
    write(tmp_path / "code", {"train.py": "print('hi')\n", "pkg/util.py": "X = 1\n"})
    (tmp_path / "code" / "run").symlink_to("train.py")
    return pack(tmp_path / "code")


def test_the_cache_root_is_private_to_the_agent(tmp_path: Path) -> None:
    SnapshotCache(tmp_path / "cache")
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700


def test_two_threads_unpack_one_digest_once(tmp_path: Path, code: Snapshot) -> None:
    cache = SnapshotCache(tmp_path / "cache")
    calls: list[int] = []
    trees: list[Path] = []

    def fetch() -> bytes:
        calls.append(1)
        time.sleep(0.3)  # the other thread arrives meanwhile
        return code.data

    threads = [
        threading.Thread(target=lambda: trees.append(cache.ensure(code.digest, fetch)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(calls) == 1
    assert trees[0] == trees[1]
    assert (trees[0] / "train.py").read_text() == "print('hi')\n"
    assert os.readlink(trees[0] / "run") == "train.py"
    assert cache.ensure(code.digest, fetch) == trees[0] and len(calls) == 1


def test_two_processes_unpack_one_digest_once(tmp_path: Path, code: Snapshot) -> None:
    (tmp_path / "upload.tar.gz").write_bytes(code.data)
    marker = tmp_path / "fetched"
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from corral.agent.snapshots import SnapshotCache

        def fetch():
            with open({str(marker)!r}, "a") as handle:
                handle.write("fetched\\n")
            time.sleep(0.5)
            return Path({str(tmp_path / "upload.tar.gz")!r}).read_bytes()

        print(SnapshotCache(Path({str(tmp_path / "cache")!r})).ensure({code.digest!r}, fetch))
        """
    )
    children = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [child.communicate(timeout=60)[0].strip() for child in children]

    assert [child.returncode for child in children] == [0, 0]
    assert outputs[0] == outputs[1]
    assert marker.read_text() == "fetched\n"
    assert (Path(outputs[0]) / "pkg" / "util.py").read_text() == "X = 1\n"


def test_bytes_of_another_digest_are_refused_and_leave_nothing(
    tmp_path: Path, code: Snapshot
) -> None:
    cache = SnapshotCache(tmp_path / "cache")
    other = snapshot_of(tmp_path / "other", {"evil.py": "import os\n"})

    with pytest.raises(ValueError, match=f"fetched for {code.digest} have the digest"):
        cache.ensure(code.digest, lambda: other.data)
    with pytest.raises(ValueError, match="is not 'sha256:' and 64 lowercase hex"):
        cache.ensure("sha256:../../etc", lambda: code.data)
    bogus = b"not an archive"
    with pytest.raises(ValueError, match=r"not a valid \.tar\.gz"):
        cache.ensure("sha256:" + hashlib.sha256(bogus).hexdigest(), lambda: bogus)

    assert not any((tmp_path / "cache" / "trees").iterdir())
    assert not any((tmp_path / "cache" / "work").iterdir())
    calls: list[int] = []
    tree = cache.ensure(code.digest, lambda: calls.append(1) or code.data)
    assert calls == [1] and not (tree / "evil.py").exists()


def test_a_half_made_tree_left_by_a_crash_is_made_again(tmp_path: Path, code: Snapshot) -> None:
    cache = SnapshotCache(tmp_path / "cache")
    key = code.digest.removeprefix("sha256:")
    # A crash while unpacking leaves scratch, and one of an older layout a tree without
    # its record: neither is taken as done.
    half = tmp_path / "cache" / "trees" / key / "tree"
    half.mkdir(parents=True)
    (half / "train.py").write_text("half")
    (tmp_path / "cache" / "work" / f"{key}.crashed" / "tree").mkdir(parents=True)
    calls: list[int] = []

    tree = cache.ensure(code.digest, lambda: calls.append(1) or code.data)

    assert calls == [1]
    assert (tree / "train.py").read_text() == "print('hi')\n"
    assert not any((tmp_path / "cache" / "work").iterdir())


def test_prune_removes_the_least_recently_used_beyond_the_cap(tmp_path: Path) -> None:
    snapshots = {
        name: snapshot_of(tmp_path / name, {"blob": name * 1000}) for name in ("a", "b", "c")
    }
    cache = SnapshotCache(tmp_path / "cache", cap_bytes=2500)
    for name in ("a", "b", "c", "a"):  # b is now the least recently used
        cache.ensure(snapshots[name].digest, lambda name=name: snapshots[name].data)
    leftover = tmp_path / "cache" / "work" / f"{'0' * 64}.crashed"
    leftover.mkdir()

    assert cache.prune() == (snapshots["b"].digest,)

    assert not leftover.exists()
    fetched: list[str] = []
    for name in ("a", "b", "c"):
        cache.ensure(
            snapshots[name].digest, lambda name=name: fetched.append(name) or snapshots[name].data
        )
    assert fetched == ["b"]


def test_prune_passes_over_a_tree_in_use(tmp_path: Path) -> None:
    snapshots = {
        name: snapshot_of(tmp_path / name, {"blob": name * 1000}) for name in ("a", "b", "c")
    }
    cache = SnapshotCache(tmp_path / "cache", cap_bytes=2500)
    for name in ("a", "b", "c"):
        cache.ensure(snapshots[name].digest, lambda name=name: snapshots[name].data)
    # a's lock held shared, as a working copy being made holds it (from another process).
    lock = tmp_path / "cache" / "locks" / snapshots["a"].digest.removeprefix("sha256:")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl,sys; f=open({str(lock)!r}); "
            "fcntl.flock(f, fcntl.LOCK_SH); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert cache.prune() == (snapshots["b"].digest,)
    finally:
        holder.communicate("", timeout=30)


def run_as(account: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", account, "--", *command], capture_output=True, text=True, timeout=30
    )


def test_a_working_copy_is_the_account_s_and_the_cache_is_not(
    unix_accounts: Accounts, code: Snapshot
) -> None:
    alice = pwd.getpwnam(unix_accounts.alice)
    with open_folder("corral-snap", 0o755) as base:
        cache = SnapshotCache(base / "cache")
        tree = cache.ensure(code.digest, lambda: code.data)
        task = base / "task"
        task.mkdir()
        task.chmod(0o777)  # the task's directory: its account may write in it

        cache.working_copy(tree, task / "code", alice.pw_uid, alice.pw_gid)

        copy = task / "code"
        for path in (copy, copy / "train.py", copy / "pkg", copy / "run"):
            info = path.lstat()
            assert (info.st_uid, info.st_gid) == (alice.pw_uid, alice.pw_gid), path
        assert os.readlink(copy / "run") == "train.py"
        wrote = run_as(
            unix_accounts.alice,
            "sh",
            "-c",
            f"echo more >> {copy}/train.py && mkdir {copy}/pkg/new && cat {copy}/run",
        )
        assert wrote.returncode == 0, wrote.stderr
        assert wrote.stdout == "print('hi')\nmore\n"
        assert (tree / "train.py").read_text() == "print('hi')\n"  # the cache's is untouched
        # bob has no business in alice's copy, nor anyone in the cache.
        assert run_as(unix_accounts.bob, "cat", f"{copy}/train.py").returncode != 0
        listed = run_as(unix_accounts.alice, "ls", str(base / "cache"))
        assert listed.returncode != 0 and "Permission denied" in listed.stderr
        assert run_as(unix_accounts.alice, "cat", str(tree / "train.py")).returncode != 0


def test_a_working_copy_follows_nothing_planted_at_or_under_its_place(
    tmp_path: Path, code: Snapshot
) -> None:
    cache = SnapshotCache(tmp_path / "cache")
    tree = cache.ensure(code.digest, lambda: code.data)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")

    # A symlink at the place: replaced by the copy, its target untouched.
    (tmp_path / "at").symlink_to(victim)
    cache.working_copy(tree, tmp_path / "at", None, None)
    assert not (tmp_path / "at").is_symlink()
    assert (tmp_path / "at" / "train.py").read_text() == "print('hi')\n"
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]

    # Symlinks under the place: removed as links, never followed.
    under = tmp_path / "under"
    (under / "pkg").mkdir(parents=True)
    (under / "train.py").symlink_to(victim / "precious")
    (under / "pkg" / "util.py").symlink_to(victim / "precious")
    (under / "deep").symlink_to(victim)
    cache.working_copy(tree, under, os.getuid(), os.getgid())
    assert (victim / "precious").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]
    assert (under / "pkg" / "util.py").read_text() == "X = 1\n"
    assert not (under / "deep").exists()
    assert under.stat().st_mode & 0o777 == 0o700
