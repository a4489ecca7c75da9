"""Work travels across Ray nodes (issue 45): a gang of two ranks, one on each of two nodes
whose agents share no directory, runs from its code snapshot and a Python environment
that each node made for itself: the snapshot reached each node through Ray's object
store, and each node built the environment with uv from a package index on loopback."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import CORRAL, open_folder, wait_until
from raycorral import GPUS, RayNodes, RayServer, require_ray, stop_server
from wheels import make_wheel, served

require_ray()

RAY_WORKERS = (("a", "r1"), ("b", "r2"))

TRAIN = """\
import os
import tinypkg
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
print("files", sorted(os.listdir(".")), flush=True)
print("tinypkg", tinypkg.VALUE, os.environ["VIRTUAL_ENV"], flush=True)
"""


class OpenRayServer(RayServer):
    """A server whose agents' directory is beside its data directory (which is 0700)."""

    @property
    def agent_dir(self) -> Path:
        return self.data_dir.parent / "agents"


@pytest.fixture(scope="module")
def ray_server(ray_nodes: RayNodes) -> Iterator[RayServer]:
    """The module's server, with its agents' directories where every account may pass (as
    an operator's /var/lib/corral): the nodes keep their environments beside them, which
    the build account and the tasks must reach. (pytest's own folders are 0700.)"""
    with open_folder("corral-ray-travel-", 0o755) as root:
        namespace = f"corral-test-{os.getpid()}-{root.name}"
        server = OpenRayServer(root / "corral", 0, address=ray_nodes.address, namespace=namespace)
        try:
            server.start()
            yield server
        finally:
            stop_server(server, ray_nodes, root)


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    with open_folder("corral-ray-wheels-", 0o755) as folder:
        (folder / "tinypkg").mkdir()
        make_wheel(folder / "tinypkg", "tinypkg")
        with served(folder) as url:
            yield url


def test_a_gang_runs_from_its_snapshot_and_environment_on_each_node(
    ray_server: RayServer, index: str, tmp_path: Path
) -> None:
    wait_until(lambda: len(ray_server.nodes()) == 2, 30, "the two worker nodes")
    ray_server.queue("team", 2 * GPUS)
    tree = tmp_path / "project"
    tree.mkdir()
    (tree / "train.py").write_text(TRAIN)
    (tree / "requirements.txt").write_text("tinypkg==1.0\n")
    env = {**os.environ, "CORRAL_SERVER": ray_server.url, "CORRAL_TOKEN": ray_server.token}
    submitted = subprocess.run(
        [
            CORRAL,
            *("submit", "-p", "team", "--workers", "2", "-g", str(GPUS)),
            *("--code", str(tree), "--requirements", str(tree / "requirements.txt")),
            *("--index-url", index, "gang", "--", "python", "train.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    done = ray_server.wait_status("gang", timeout=180)
    logs = [ray_server.log_text("gang", task) for task in (0, 1)]
    assert done["status"] == "succeeded", f"{done['reason']}\n{logs}"
    for rank, log in enumerate(logs):
        assert f"rank {rank} of 2" in log, log
        assert "files ['requirements.txt', 'train.py']" in log, log
        assert "tinypkg tinypkg" in log, log
    # Each node unpacked the snapshot and built the environment in its own directories.
    agents = ray_server.agent_dir
    names = ["a", "b"]  # the worker nodes, one rank each (the head has no GPU)
    for name in names:
        assert len(list((agents / name / "snapshots" / "trees").iterdir())) == 1, name
        assert len(list((agents / f"{name}-envs" / "envs").iterdir())) == 1, name
