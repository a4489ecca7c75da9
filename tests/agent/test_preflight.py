"""Whether a task's account could start its command, asked before the task exists
(corral.agent.preflight), against real Unix accounts and real modes; and the kernel's own
answer when the task is then started as the account, so that the check agrees with it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import Accounts

from corral.agent.identity import Identity, identity_of
from corral.agent.preflight import cannot_start

PROGRAM = "#!/bin/sh\necho ran\n"


@pytest.fixture
def alice(unix_accounts: Accounts) -> Identity:
    return identity_of(unix_accounts.alice)


@pytest.fixture
def tree() -> Iterator[Path]:
    """A directory every account may pass through (pytest's own is 0700, root's)."""
    root = Path(tempfile.mkdtemp(prefix="corral-preflight-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=True)


def program(path: Path, text: str = PROGRAM, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def kernel_runs(command: list[str], env: dict[str, str], identity: Identity) -> bool:
    """Whether the command starts when run as the account, as a task would be."""
    try:
        done = subprocess.run(
            command,
            env=env,
            user=identity.uid,
            group=identity.gid,
            extra_groups=list(identity.groups),
            cwd="/",
            capture_output=True,
            timeout=10,
        )
    except PermissionError:
        return False
    return done.returncode != 126


def test_a_program_behind_a_private_directory_is_refused_with_the_directory(
    tree: Path, alice: Identity
) -> None:
    private = tree / "home"
    tool = program(private / "venv" / "bin" / "tool")
    os.chmod(private, 0o700)
    env = {"PATH": f"{tool.parent}:/usr/bin:/bin"}
    refusal = cannot_start(["tool"], env, None, alice)
    assert refusal is not None
    assert refusal.field == "command"
    assert f"account {alice.name} cannot execute 'tool'" in refusal.reason
    assert f"{private} (mode 700) is closed to it" in refusal.reason
    assert not kernel_runs(["tool"], env, alice)
    # Opened, it is allowed, and the kernel agrees.
    os.chmod(private, 0o755)
    assert cannot_start(["tool"], env, None, alice) is None
    assert kernel_runs(["tool"], env, alice)


def test_a_later_path_entry_the_account_may_run_wins_as_with_execvp(
    tree: Path, alice: Identity
) -> None:
    closed = program(tree / "closed" / "tool")
    os.chmod(closed.parent, 0o700)
    program(tree / "open" / "tool")
    env = {"PATH": f"{closed.parent}:{tree / 'open'}"}
    assert cannot_start(["tool"], env, None, alice) is None
    assert kernel_runs(["tool"], env, alice)


def test_a_script_whose_interpreter_is_closed_is_refused_naming_the_interpreter(
    tree: Path, alice: Identity
) -> None:
    interpreter = program(tree / "private" / "python", '#!/bin/sh\nexec /bin/sh "$@"\n')
    os.chmod(interpreter.parent, 0o700)
    script = program(tree / "shared" / "train", f"#!{interpreter}\necho hi\n")
    refusal = cannot_start([str(script)], {}, None, alice)
    assert refusal is not None and refusal.field == "command"
    assert f"its interpreter {interpreter}" in refusal.reason
    assert not kernel_runs([str(script)], {}, alice)


def test_a_file_without_execute_for_the_account_is_refused(tree: Path, alice: Identity) -> None:
    tool = program(tree / "bin" / "tool", mode=0o750)  # root's group only
    refusal = cannot_start([str(tool)], {}, None, alice)
    assert refusal is not None and "mode 750, not executable by it" in refusal.reason
    assert not kernel_runs([str(tool)], {}, alice)


def test_an_acl_that_grants_access_is_honoured(tree: Path, alice: Identity) -> None:
    """The modes say no, the kernel says yes: the kernel's answer counts."""
    private = tree / "acl"
    tool = program(private / "tool")
    os.chmod(private, 0o700)
    granted = subprocess.run(
        ["setfacl", "-m", f"u:{alice.name}:x", str(private)], capture_output=True
    )
    if granted.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"setfacl failed in CI: {granted.stderr!r}")
        pytest.skip(f"no ACLs here: {granted.stderr!r}")
    assert kernel_runs([str(tool)], {}, alice)
    assert cannot_start([str(tool)], {}, None, alice) is None


def test_a_working_directory_the_account_cannot_enter_is_refused(
    tree: Path, alice: Identity
) -> None:
    work = tree / "work"
    work.mkdir()
    os.chmod(work, 0o700)
    refusal = cannot_start(["true"], {}, str(work), alice)
    assert refusal is not None and refusal.field == "workdir"
    assert f"{work} (mode 700) is closed to it" in refusal.reason


def test_nothing_is_refused_for_root_or_for_a_program_found_nowhere(
    tree: Path, alice: Identity
) -> None:
    closed = program(tree / "closed" / "tool")
    os.chmod(closed.parent, 0o700)
    assert cannot_start([str(closed)], {}, None, identity_of("root")) is None
    assert cannot_start(["no-such-program-here"], {"PATH": str(tree)}, None, alice) is None
    assert cannot_start(["sh", "-c", "true"], {}, None, alice) is None
    # Where the program is looked for depends on a working directory not known here.
    assert cannot_start(["tool"], {"PATH": f"bin:{closed.parent}"}, None, alice) is None
    assert cannot_start(["./tool"], {}, None, alice) is None
