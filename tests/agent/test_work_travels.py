"""Work travels (docs/workloads.md): on a real `corral up` whose agent runs as root, a
member submits with the CLI a command that needs its code and a Python package that no
account of the machine has: `--code DIR` brings the directory's files (not the ignored
ones, not a link out of it) into a copy of the task's own, `--requirements` makes the
node build an environment with uv from a wheel served on this machine (no network), and
the task runs as the member's Unix account with both. A second submit of the same tree
sends nothing, and its environment is the one built before."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from images import busybox_image, need_podman, podman
from livecorral import CORRAL, Accounts, CorralUp, Servers, open_folder, team_members
from wheels import make_wheel, served

from corral.agent.cgroups import agent_key
from corral.agent.identity import identity_of

TRAIN = """\
import os, sys
import tinypkg
print("cwd", os.getcwd())
print("files", sorted(os.listdir(".")))
print("tinypkg", tinypkg.VALUE)
print("venv", os.environ.get("VIRTUAL_ENV"), sys.prefix == os.environ.get("VIRTUAL_ENV"))
print("uid", os.getuid())
open("output.txt", "w").write("written by the task\\n")
"""


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    """A package index on this machine's loopback (the directory listings of
    SimpleHTTPRequestHandler are the pages of a simple index): ROOT/simple/ holds the
    wheel's project, ROOT/links/ is a page of links to it. No other index is asked."""
    with open_folder("corral-wheels-", 0o755) as folder:
        (folder / "simple" / "tinypkg").mkdir(parents=True)
        (folder / "links").mkdir()
        make_wheel(folder / "simple" / "tinypkg", "tinypkg")
        make_wheel(folder / "links", "tinypkg")
        with served(folder) as url:
            yield url


@pytest.fixture
def tree() -> Iterator[Path]:
    """The member's project: code, requirements, an ignored directory and a link out."""
    with open_folder("corral-code-", 0o755) as folder:
        (folder / "train.py").write_text(TRAIN)
        (folder / "requirements.txt").write_text("tinypkg==1.0\n")
        (folder / ".gitignore").write_text("data/\n*.log\n")
        (folder / "data").mkdir()
        (folder / "data" / "big.bin").write_bytes(b"\0" * 4096)
        (folder / "run.log").write_text("ignored\n")
        (folder / ".corralignore").write_text("notes.md\n")
        (folder / "notes.md").write_text("ignored too\n")
        (folder / "secret").symlink_to("/etc/shadow")
        (folder / "lib").mkdir()
        (folder / "lib" / "helper.py").write_text("X = 1\n")
        yield folder


@pytest.fixture
def up(corral_up: Servers) -> Iterator[CorralUp]:
    """`corral up` with its data directory in a folder every account may pass through: the
    node's environments and the tasks' copies of their code sit beside it (pytest's own
    folders are closed to other accounts, and a node there builds none)."""
    with open_folder("corral-travel-", 0o755) as folder:
        server = CorralUp(folder / "corral", 1)
        corral_up.started.append(server)
        server.start()
        yield server
        server.close()


def cli(up: CorralUp, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_SERVER": up.url, "CORRAL_TOKEN": token}
    return subprocess.run(
        [CORRAL, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_code_and_environment_reach_the_task(
    up: CorralUp, unix_accounts: Accounts, tree: Path, index: str
) -> None:
    alice, _ = team_members(up, unix_accounts)
    submit = [
        "submit",
        "-p",
        "team",
        "--code",
        str(tree),
        "--requirements",
        str(tree / "requirements.txt"),
        "--index-url",
        f"{index}simple/",
        "--find-links",
        f"{index}links/",
    ]
    first = cli(up, alice, *submit, "first", "--", "python", "train.py")
    assert first.returncode == 0, first.stderr
    assert "secret is left out" in first.stderr, first.stderr
    assert "sent" in first.stderr, first.stderr
    done = up.wait_status("first", timeout=180)
    log = up.log_text("first")
    assert done["status"] == "succeeded", f"{done['reason']}\n{log}"
    assert done["code"].startswith("sha256:")
    # The task ran as alice, in its own copy of the tree, with the environment's Python.
    account = identity_of(unix_accounts.alice)
    assert f"uid {account.uid}" in log
    assert "tinypkg tinypkg" in log
    # What the agent did before it started is in the log, each step once.
    assert "[corral: building environment: 1 of 1 packages]" in log, log
    assert "[corral: building environment: done]" in log, log
    assert "[corral: fetching code]" in log, log
    listed = next(line for line in log.splitlines() if line.startswith("files "))
    assert listed == "files ['.corralignore', '.gitignore', 'lib', 'requirements.txt', 'train.py']"
    venv = next(line for line in log.splitlines() if line.startswith("venv "))
    assert venv.endswith(" True"), venv
    cwd = Path(next(line for line in log.splitlines() if line.startswith("cwd ")).split()[1])
    # Its output stays after its end, in its copy, which is alice's.
    assert (cwd / "output.txt").read_text() == "written by the task\n"
    assert cwd.stat().st_uid == account.uid
    # The environment is not hers to change.
    environment = Path(venv.split()[1])
    assert environment.stat().st_uid == 0
    written = subprocess.run(
        ["runuser", "-u", unix_accounts.alice, "--", "touch", str(environment / "bin" / "x")],
        capture_output=True,
        check=False,
    )
    assert written.returncode != 0
    # The same tree again: nothing is sent, and the environment is the one built.
    second = cli(up, alice, *submit, "second", "--", "python", "train.py")
    assert second.returncode == 0, second.stderr
    assert "the server has it already" in second.stderr, second.stderr
    assert up.wait_status("second", timeout=120)["status"] == "succeeded"
    again = up.log_text("second")
    assert f"venv {environment} True" in again, again
    assert next(line for line in again.splitlines() if line.startswith("cwd ")) != f"cwd {cwd}"


def test_a_failed_build_is_the_workloads_reason(
    up: CorralUp, unix_accounts: Accounts, tree: Path, index: str
) -> None:
    alice, _ = team_members(up, unix_accounts)
    (tree / "requirements.txt").write_text("tinypkg==9.9\n")
    made = cli(
        up,
        alice,
        *("submit", "-p", "team", "--requirements", str(tree / "requirements.txt")),
        *("--index-url", f"{index}simple/", "broken", "--", "python", "-c", "import tinypkg"),
    )
    assert made.returncode == 0, made.stderr
    done = up.wait_status("broken", timeout=120)
    assert done["status"] == "failed", done
    assert "its Python environment could not be built" in done["reason"], done
    assert "tinypkg==9.9" in done["reason"], done


# A training step loop in busybox's sh: resumes from its checkpoint, and on SIGTERM (a
# preemption) writes it and exits, as a real job checkpoints in its grace period.
IMAGE_TRAIN = r"""
ck="$CORRAL_CHECKPOINT_DIR/step"
mkdir -p "$CORRAL_CHECKPOINT_DIR"
step=0
if [ -f "$ck" ]; then step=$(cat "$ck"); echo "resumed at $step"; fi
echo "uid $(id -u) gid $(id -g) home $HOME"
trap 'echo "$step" > "$ck"; echo "checkpointed at $step"; exit 0' TERM
# A first run lasts until it is preempted (a minute at most); the resumed one, 30 steps.
if [ "$step" -gt 0 ]; then end=$((step + 30)); else end=600; fi
while [ "$step" -lt "$end" ]; do step=$((step + 1)); sleep 0.1; done
echo "done at $step"
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    need_podman()
    with busybox_image(tmp_path_factory.mktemp("image")) as name:
        yield name


def test_a_task_in_an_image_is_preempted_and_resumes_from_its_checkpoint(
    up: CorralUp, unix_accounts: Accounts, image: str
) -> None:
    alice, _ = team_members(up, unix_accounts)
    account = identity_of(unix_accounts.alice)
    made = cli(
        up,
        alice,
        *("submit", "-p", "team", "-g", "1", "--image", image, "--grace-period", "10"),
        *("boxed", "--", "sh", "-c", IMAGE_TRAIN),
    )
    assert made.returncode == 0, made.stderr
    # Placed on the node once its agent found it runs containers (its label).
    up.wait_status("boxed", "running", timeout=60)
    up.wait_log("boxed", "uid", timeout=60)
    log = up.log_text("boxed")
    assert f"uid {account.uid} gid {account.gid}" in log, log
    # A build workload of the same project takes the GPU: the training is preempted,
    # checkpoints in its grace period, and waits.
    urgent = cli(
        up,
        alice,
        *("submit", "-p", "team", "-g", "1", "--interactive", "urgent"),
        *("--", "sleep", "2"),
    )
    assert urgent.returncode == 0, urgent.stderr
    up.wait_log("boxed", "checkpointed at", timeout=60)
    assert up.wait_status("urgent", timeout=60)["status"] == "succeeded"
    done = up.wait_status("boxed", timeout=120)
    log = up.log_text("boxed")
    assert done["status"] == "succeeded", f"{done['reason']}\n{log}"
    saved = int(log.split("checkpointed at ")[1].split()[0])
    assert f"resumed at {saved}" in log, log
    assert f"done at {saved + 30}" in log, log
    assert done["attempts"] == 2, done
    # Nothing of it is left in podman.
    assert containers_of(up) == []


def test_an_image_with_an_environment_is_refused_and_one_missing_fails(
    up: CorralUp, unix_accounts: Accounts, image: str, tree: Path
) -> None:
    alice, _ = team_members(up, unix_accounts)
    both = cli(
        up,
        alice,
        *("submit", "-p", "team", "--image", image),
        *("--requirements", str(tree / "requirements.txt"), "--", "true"),
    )
    assert both.returncode == 2, both.stderr
    assert "give an image or a Python environment, not both" in both.stderr
    missing = "localhost/corral-test-missing:latest"
    made = cli(up, alice, "submit", "-p", "team", "--image", missing, "absent", "--", "true")
    assert made.returncode == 0, made.stderr
    done = up.wait_status("absent", timeout=60)
    assert done["status"] == "failed", done
    assert "its image cannot run here" in done["reason"], done
    assert missing in done["reason"], done


def test_a_task_in_an_image_outlives_a_restart_of_corral(
    up: CorralUp, unix_accounts: Accounts, image: str
) -> None:
    """kill -9 of `corral up` leaves the container running; the restarted agent adopts it
    and records how it ended, as for a process."""
    alice, _ = team_members(up, unix_accounts)
    script = 'echo started; i=0; while [ "$i" -lt 40 ]; do i=$((i + 1)); sleep 0.1; done; exit 3'
    made = cli(
        up, alice, *("submit", "-p", "team", "--image", image, "lasting"), "--", "sh", "-c", script
    )
    assert made.returncode == 0, made.stderr
    up.wait_log("lasting", "started", timeout=60)
    [(_, launcher)] = up.started_pids("lasting")
    up.kill9()
    assert len(containers_of(up)) == 1
    up.start()
    done = up.wait_status("lasting", timeout=60)
    assert (done["status"], done["exit_code"]) == ("failed", 3), done
    assert up.started_pids("lasting") == [(0, launcher)]  # adopted, not started again
    assert containers_of(up) == []


def containers_of(up: CorralUp) -> list[str]:
    """The containers podman has of the tasks of `up`'s agent (corral.agent.containers
    names them after the agent's key)."""
    prefix = f"corral-{agent_key(up.data_dir)}-"
    found = podman("ps", "-a", "--filter", f"name=^{prefix}", "--format", "{{.Names}}")
    return found.stdout.split()


def test_the_nodes_own_index_serves_a_workload_that_names_none(
    corral_up: Servers, unix_accounts: Accounts, tree: Path, index: str
) -> None:
    """`corral up --index-url` is where the node's environments come from when the
    workload says nothing (no PyPI here); what uv did is in the task's log."""
    with open_folder("corral-travel-", 0o755) as folder:
        up = CorralUp(folder / "corral", 1, args=["--index-url", f"{index}simple/"])
        corral_up.started.append(up)
        up.start()
        alice, _ = team_members(up, unix_accounts)
        made = cli(
            up,
            alice,
            *("submit", "-p", "team", "--requirements", str(tree / "requirements.txt")),
            *("plain", "--", "python", "-c", "import tinypkg; print('got', tinypkg.VALUE)"),
        )
        assert made.returncode == 0, made.stderr
        done = up.wait_status("plain", timeout=120)
        log = up.log_text("plain")
        assert done["status"] == "succeeded", f"{done['reason']}\n{log}"
        assert "got tinypkg" in log
        assert "[corral: building environment" in log, log
        up.close()
