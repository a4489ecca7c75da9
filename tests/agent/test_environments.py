"""corral.agent.environments with the real uv: wheels made by hand, served from a directory
(the node's find-links) or over HTTP on 127.0.0.1 (a workload's), never the network."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from livecorral import Accounts, open_folder
from wheels import make_wheel, served

from corral.agent.environments import (
    MARKER,
    EnvironmentCache,
    EnvironmentFailed,
    PythonEnv,
    check_python_env,
)

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def needs_root() -> None:
    """Skip without root, except in CI, which runs as root."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root, and this test needs root")
        pytest.skip("needs root")


@pytest.fixture(scope="module")
def wheels() -> Iterator[Path]:
    """alpha, beta (needs alpha) and gamma (needs beta), where every account may read."""
    with open_folder("corral-wheels-", 0o755) as folder:
        make_wheel(folder, "alpha")
        make_wheel(folder, "beta", ("alpha",))
        make_wheel(folder, "gamma", ("beta",))
        (folder / "empty-index").mkdir(mode=0o755)
        yield folder


@pytest.fixture
def cache(wheels: Path) -> Iterator[EnvironmentCache]:
    """A cache whose only index is an empty directory and whose find-links are the wheels:
    uv never reaches for PyPI."""
    with open_folder("corral-envs-", 0o755) as root:
        yield EnvironmentCache(
            root / "cache",
            index_url=str(wheels / "empty-index"),
            find_links=(str(wheels),),
        )


def requirements(text: str) -> PythonEnv:
    return PythonEnv((("requirements.txt", text),), PYTHON)


def run_as(account: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", account, "--", *command], capture_output=True, text=True, check=False
    )


def test_a_task_account_runs_the_environment_and_cannot_change_it(
    cache: EnvironmentCache, unix_accounts: Accounts
) -> None:
    started = time.monotonic()
    venv = cache.ensure(requirements("gamma\n"))
    cold = time.monotonic() - started
    python = str(venv / "bin" / "python")
    done = run_as(unix_accounts.alice, python, "-c", "import alpha, gamma; print(gamma.VALUE)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gamma"
    assert cold < 60
    site = next(venv.glob("lib/python*/site-packages"))
    for target in (site / "planted.py", site / "gamma" / "__init__.py", venv / "bin" / "x"):
        write = f"open({str(target)!r}, 'a').write('x')"
        assert run_as(unix_accounts.bob, python, "-c", write).returncode != 0, target
    for path in [venv, *venv.rglob("*")]:
        info = os.lstat(path)
        assert info.st_uid == 0, path
        if stat.S_ISDIR(info.st_mode):
            assert stat.S_IMODE(info.st_mode) == 0o755, path
        elif stat.S_ISREG(info.st_mode):
            assert stat.S_IMODE(info.st_mode) in (0o644, 0o755), path


def test_a_second_ensure_reuses_the_build(cache: EnvironmentCache) -> None:
    first = cache.ensure(requirements("beta\n"))
    marker = os.stat(first / MARKER)
    heard: list[str] = []
    started = time.monotonic()
    second = cache.ensure(requirements("beta\n"), heard.append)
    assert time.monotonic() - started < 1
    assert second == first
    assert os.stat(second / MARKER).st_ino == marker.st_ino
    assert heard == []
    # The same requirements for another Python, or with another index, are another key.
    other = PythonEnv((("requirements.txt", "beta\n"),), PYTHON, find_links=("http://x/",))
    assert cache.key_of(other) != cache.key_of(requirements("beta\n"))


def test_concurrent_threads_build_once(cache: EnvironmentCache) -> None:
    heard: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: cache.ensure(requirements("gamma\n"), heard.append), "ab"))
    assert paths[0] == paths[1]
    assert heard.count("building environment: resolving") == 1


BUILD_ONE = """
import sys
from pathlib import Path
from corral.agent.environments import EnvironmentCache, PythonEnv
cache = EnvironmentCache(Path(sys.argv[1]), index_url=sys.argv[2], find_links=(sys.argv[3],))
env = PythonEnv((("requirements.txt", "gamma\\n"),), sys.argv[4])
print(cache.ensure(env, lambda text: print(text, flush=True)))
"""


def test_concurrent_processes_build_once(cache: EnvironmentCache, wheels: Path) -> None:
    command = [
        sys.executable, "-c", BUILD_ONE, str(cache.root), str(wheels / "empty-index"),
        str(wheels), PYTHON,
    ]  # fmt: skip
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
    lines = [line for out, _ in outputs for line in out.splitlines()]
    assert lines.count("building environment: resolving") == 1
    assert len({out.splitlines()[-1] for out, _ in outputs}) == 1


def test_a_version_that_does_not_exist_fails_with_uvs_message(cache: EnvironmentCache) -> None:
    env = requirements("alpha==9.9\n")
    with pytest.raises(EnvironmentFailed) as failed:
        cache.ensure(env)
    assert failed.value.message.startswith("No solution found when resolving dependencies: ")
    assert "there is no version of alpha==9.9" in failed.value.message
    assert not (cache.root / "envs" / cache.key_of(env)).exists()
    assert list((cache.root / "builds").iterdir()) == []


def test_a_root_only_wheel_is_not_installed(cache: EnvironmentCache, tmp_path: Path) -> None:
    needs_root()
    # pytest's tmp_path is 0700 and root's: the build account cannot read into it.
    secret = make_wheel(tmp_path, "secret")
    (tmp_path / "more.txt").write_text(f"{secret}\n")
    lines = (
        str(secret),
        secret.as_uri(),
        f"secret\n--find-links {tmp_path.as_uri()}",
        f"-r {tmp_path}/more.txt",
    )
    for line in lines:
        env = requirements(line + "\n")
        with pytest.raises(EnvironmentFailed, match=r"not found|Permission denied"):
            cache.ensure(env)
        assert not (cache.root / "envs" / cache.key_of(env)).exists()
    # The same wheel where every account may read it is installed: the wall stopped it.
    with open_folder("corral-open-", 0o755) as folder:
        opened = make_wheel(folder, "secret")
        venv = cache.ensure(requirements(f"{opened}\n"))
        assert subprocess.run([venv / "bin" / "python", "-c", "import secret"]).returncode == 0


def test_a_cache_tasks_could_not_reach_is_refused(tmp_path: Path) -> None:
    needs_root()
    with pytest.raises(PermissionError, match="which other accounts cannot enter"):
        EnvironmentCache(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_progress_counts_real_packages(cache: EnvironmentCache) -> None:
    heard: list[str] = []
    cache.ensure(requirements("gamma\n"), heard.append)
    assert "building environment: resolving" in heard
    assert "building environment: 3 packages to install" in heard
    counts = [re.fullmatch(r"building environment: (\d+) of (\d+) packages", h) for h in heard]
    pairs = [(int(m.group(1)), int(m.group(2))) for m in counts if m]
    assert pairs[-1] == (3, 3)
    assert all(total == 3 and 0 <= done <= 3 for done, total in pairs)
    assert heard[-1] == "building environment: done"


def size_of(venv: Path) -> int:
    files = [p for p in venv.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(os.lstat(p).st_size for p in files if p.name != MARKER)


def test_prune_removes_the_least_recently_used(cache: EnvironmentCache) -> None:
    built = {name: cache.ensure(requirements(f"{name}\n")) for name in ("alpha", "beta", "gamma")}
    cache.ensure(requirements("alpha\n"))  # alpha is now the most recently used
    sizes = {name: size_of(path) for name, path in built.items()}
    assert cache.prune(grace=0) == []
    cache.cap_bytes = sum(sizes.values()) - 1
    assert cache.prune(grace=60) == []  # all were just used
    keep = {built["beta"].name}
    assert cache.prune(in_use=keep, grace=0) == [built["gamma"].name]
    assert cache.prune(grace=0) == []
    cache.cap_bytes = sizes["alpha"]
    assert cache.prune(grace=0) == [built["beta"].name]
    assert [p.name for p in (cache.root / "envs").iterdir()] == [built["alpha"].name]
    # What a build whose agent was killed left is removed too.
    (cache.root / "builds" / f"{'0' * 64}.cut-short" / "venv").mkdir(parents=True)
    assert cache.prune(grace=0) == []
    assert list((cache.root / "builds").iterdir()) == []
    # A pruned environment is built again when asked for.
    assert (cache.ensure(requirements("gamma\n")) / MARKER).is_file()


def test_a_build_cut_short_is_redone(cache: EnvironmentCache) -> None:
    env = requirements("alpha\n")
    leftover = cache.root / "envs" / cache.key_of(env)
    (leftover / "bin").mkdir(parents=True)
    (leftover / "bin" / "python").write_text("half")
    venv = cache.ensure(env)
    assert venv == leftover
    assert (venv / MARKER).is_file()
    done = subprocess.run([venv / "bin" / "python", "-c", "import alpha"], check=False)
    assert done.returncode == 0


@pytest.fixture
def served_wheels(wheels: Path) -> Iterator[str]:
    """The wheels over HTTP on 127.0.0.1, as a directory listing uv reads as find-links."""
    with served(wheels) as url:
        yield url


def test_a_workloads_find_links_over_http(served_wheels: str, wheels: Path) -> None:
    with open_folder("corral-envs-", 0o755) as root:
        cache = EnvironmentCache(root / "cache", index_url=str(wheels / "empty-index"))
        env = PythonEnv((("requirements.txt", "beta\n"),), PYTHON, find_links=(served_wheels,))
        venv = cache.ensure(env)
        done = subprocess.run(
            [venv / "bin" / "python", "-c", "import alpha, beta"], capture_output=True, check=False
        )
        assert done.returncode == 0, done.stderr


def test_a_project_and_a_locked_project(cache: EnvironmentCache, wheels: Path) -> None:
    pyproject = (
        '[project]\nname = "work"\nversion = "0.1"\nrequires-python = ">=3.8"\n'
        'dependencies = ["beta"]\n'
    )
    venv = cache.ensure(PythonEnv((("pyproject.toml", pyproject),), PYTHON))
    done = subprocess.run([venv / "bin" / "python", "-c", "import alpha, beta"], check=False)
    assert done.returncode == 0
    with open_folder("corral-project-", 0o755) as project:
        (project / "pyproject.toml").write_text(pyproject)
        uv = Path(sys.executable).with_name("uv")
        subprocess.run(
            [uv, "lock", "--offline", "--no-config", "--find-links", str(wheels),
             "--index-url", (wheels / "empty-index").as_uri()],
            cwd=project, check=True, capture_output=True,
        )  # fmt: skip
        lock = (project / "uv.lock").read_text()
    heard: list[str] = []
    env = PythonEnv((("pyproject.toml", pyproject), ("uv.lock", lock)), PYTHON)
    venv = cache.ensure(env, heard.append)
    assert "building environment: 2 packages to install" in heard
    done = subprocess.run([venv / "bin" / "python", "-c", "import alpha, beta"], check=False)
    assert done.returncode == 0
    installed = json.loads((venv / MARKER).read_text())["packages"]
    assert installed == 2


@pytest.mark.parametrize(
    ("env", "field"),
    [
        (PythonEnv((("setup.py", ""),)), "files"),
        (PythonEnv((("uv.lock", ""),)), "files"),
        (PythonEnv((("requirements.txt", ""),), "/home/x/python"), "version"),
        (PythonEnv((("requirements.txt", ""),), index_url="file:///etc"), "index_url"),
        (PythonEnv((("requirements.txt", ""),), find_links=("/srv/wheels",)), "find_links"),
    ],
)
def test_an_environment_it_does_not_build_names_the_field(env: PythonEnv, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        check_python_env(env)
