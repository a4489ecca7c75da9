"""A data or workloads directory planted by another account is refused, and nothing is
written through it: tried as that account would, with a real Unix account (bob) planting
directories, files and symlinks in a directory every account may write, and `corral up`
run as root.

The finding (issue 44): with `--data-dir /tmp/x/corral`, where /tmp/x is 1777 and another
account had made `corral/` and `admin-token` there, corral wrote the admin token into that
account's file, and later changed the mode of the directory that account had pointed
`corral-workloads` at.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from livecorral import CORRAL, Accounts, CorralUp, free_port

from corral.agent.identity import identity_of, workload_directory
from corral.agent.planted import Planted, own_directory, write_private
from corral.store.secrets import load_key


def _folder(prefix: str, mode: int) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(folder, mode)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every account may write, with the sticky bit, as /tmp is."""
    yield from _folder("corral-shared-", 0o1777)


@pytest.fixture
def target() -> Iterator[Path]:
    """A directory of root's that an attacker would like corral to open up (0750)."""
    yield from _folder("corral-target-", 0o750)


def as_account(name: str, *command: str) -> None:
    """Run `command` as the account `name`, with its own group only: the attacker."""
    entry = pwd.getpwnam(name)
    subprocess.run(
        command, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], check=True, timeout=30
    )


def tree(*roots: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry of `roots` and under them, never following a symlink: its mode, owner,
    size and where it points. Equal before and after means nothing was written."""
    seen = {}
    for root in roots:
        paths = [root]
        if root.is_dir() and not root.is_symlink():
            paths += [Path(top) / n for top, dirs, files in os.walk(root) for n in dirs + files]
        for path in paths:
            if not os.path.lexists(path):
                continue
            info = os.lstat(path)
            link = os.readlink(path) if stat.S_ISLNK(info.st_mode) else ""
            seen[str(path)] = (info.st_mode, info.st_uid, info.st_size, link)
    return seen


def refused_start(*args: str) -> str:
    """The one line on stderr of a `corral up` that must refuse to start; it fails the
    test if corral starts instead."""
    command = [CORRAL, "up", "--port", str(free_port()), "--virtual-gpus", "1", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"corral up started with {args}: {expired.stdout!r}") from None
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.stdout == "", done.stdout
    return lines[0]


def plant_data_dir(bob: str, shared: Path, target: Path) -> None:
    """bob's own corral/, open to all, with an admin-token of his for corral to fill."""
    as_account(bob, "mkdir", "-m", "777", str(shared / "corral"))
    as_account(bob, "install", "-m", "666", "/dev/null", str(shared / "corral" / "admin-token"))


def plant_data_dir_link(bob: str, shared: Path, target: Path) -> None:
    """corral/ as bob's symlink to a directory corral would make 0700 and write in."""
    as_account(bob, "ln", "-s", str(target), str(shared / "corral"))


def plant_parent(bob: str, shared: Path, target: Path) -> None:
    """bob's team/ above the data directory: he may swap what corral makes in it."""
    as_account(bob, "mkdir", "-m", "777", str(shared / "team"))


def plant_workloads_link(bob: str, shared: Path, target: Path) -> None:
    """corral-workloads (DATA_DIR-workloads, the default) as bob's symlink to root's
    directory, whose mode the agent would set to 0711."""
    as_account(bob, "ln", "-s", str(target), str(shared / "corral-workloads"))


@pytest.mark.parametrize(
    ("plant", "data_dir", "named"),
    [
        (plant_data_dir, "corral", "corral is owned by {bob}, not by root"),
        (plant_data_dir_link, "corral", "corral is a symlink (to {target}) made by {bob}"),
        (plant_parent, "team/corral", "team is owned by {bob}, not by root"),
        (
            plant_workloads_link,
            "corral",
            "corral-workloads is a symlink (to {target}) made by {bob}",
        ),
    ],
    ids=["data-dir", "data-dir-symlink", "parent", "workloads-dir-symlink"],
)
def test_a_planted_directory_is_refused_in_one_line_naming_its_owner_and_nothing_is_written(
    unix_accounts: Accounts,
    shared: Path,
    target: Path,
    plant: Callable[[str, Path, Path], None],
    data_dir: str,
    named: str,
) -> None:
    bob = unix_accounts.bob
    plant(bob, shared, target)
    before = tree(shared, target)

    line = refused_start("--data-dir", str(shared / data_dir))

    expected = f"{shared}/{named.format(bob=bob, target=target)}"
    assert expected in line, line
    assert "is refused" in line, line
    assert tree(shared, target) == before


def test_a_shared_directory_without_the_sticky_bit_is_refused(shared: Path) -> None:
    # Anyone may rename what corral makes there, whoever owns it.
    os.chmod(shared, 0o777)
    line = refused_start("--data-dir", str(shared / "corral"))
    assert f"{shared} may be written by every account and has no sticky bit" in line, line
    assert list(shared.iterdir()) == []


def test_a_workloads_directory_planted_after_the_start_fails_the_task_not_the_target(
    unix_accounts: Accounts, shared: Path, target: Path, tmp_path: Path
) -> None:
    # Checked at the start, the workloads directory is made at the first launch: bob plants
    # it in between. The agent refuses it then; the task fails with the reason.
    up = CorralUp(tmp_path / "corral", gpus=1, workloads_dir=shared / "corral-workloads")
    try:
        up.start()
        up.queue("team", 1)
        plant_workloads_link(unix_accounts.bob, shared, target)
        before = tree(target)
        up.submit("first", "team", ["true"])
        assert up.wait_status("first")["status"] == "failed"
        reasons = " ".join(event["reason"] or "" for event in up.events("first"))
        assert f"{shared}/corral-workloads is a symlink (to {target}) made by" in reasons, reasons
        assert tree(target) == before
    finally:
        up.close()


def test_the_workloads_root_of_another_account_is_refused_at_each_launch(
    unix_accounts: Accounts, shared: Path
) -> None:
    root = shared / "corral-workloads"
    as_account(unix_accounts.bob, "mkdir", "-m", "755", str(root))
    with pytest.raises(Planted, match=f"{root} is owned by {unix_accounts.bob}"):
        workload_directory(root, "job", identity_of(unix_accounts.alice))
    assert sorted(os.listdir(root)) == []
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755


def test_an_unplanted_path_under_a_shared_directory_is_made_and_taken(shared: Path) -> None:
    # The control: corral's own directories under a sticky shared one are used.
    data_dir = shared / "team" / "corral"
    own_directory(data_dir, 0o700, "--data-dir")
    assert os.lstat(data_dir.parent).st_uid == os.geteuid()
    info = os.lstat(data_dir)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700)
    own_directory(data_dir, 0o700, "--data-dir")  # and again on the next start


# -- files corral writes in its data directory ---------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "fifo", "others"])
def test_a_private_file_is_never_written_through_a_planted_one(
    unix_accounts: Accounts, tmp_path: Path, target: Path, kind: str
) -> None:
    path = tmp_path / "admin-token"
    elsewhere = target / "token"
    elsewhere.write_text("")
    if kind == "symlink":
        path.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(path)  # a plain open() for writing would wait for a reader forever
    else:
        path.write_text("")
        bob = pwd.getpwnam(unix_accounts.bob)
        os.chown(path, bob.pw_uid, bob.pw_gid)
    with pytest.raises(Planted, match=f"{path} is a .* owned by"):
        write_private(path, b"crl_secret\n")
    assert elsewhere.read_text() == ""
    if kind == "others":
        assert path.read_text() == ""


def test_a_private_file_is_made_0600_and_an_own_one_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    write_private(path, b"first\n")
    os.chmod(path, 0o644)
    write_private(path, b"second\n")
    assert path.read_bytes() == b"second\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_planted_secret_key_link_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key someone else chose is one they know: it would open every project secret.
    monkeypatch.delenv("CORRAL_SECRET_KEY", raising=False)
    monkeypatch.delenv("CORRAL_SECRET_KEY_FILE", raising=False)
    known = tmp_path / "known-key"
    known.write_bytes(b"a" * 43 + b"=\n")
    (tmp_path / "secret-key").symlink_to(known)
    with pytest.raises(OSError, match="secret-key"):
        load_key(tmp_path)
