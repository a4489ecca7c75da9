"""Distributed jobs survive their machines (docs/multi-node.md), tried with a job whose
ranks really depend on each other (ranks.py: a rank exits 1 as soon as a peer vanishes,
as gloo, NCCL and MPI ranks do), on a real Ray cluster and a server with the default
timeouts (loss 10 s, fence 4 s):

- a node lost mid-run, five times over: the gang is requeued every time, never failed,
  no retry is used, every rank resumes from its last checkpoint, and no rank ever runs
  twice at once;
- the server killed (-9) and back after 30 s: every task keeps its process, no attempt
  is used;
- a task printing a numbered line every 10 ms while the server is killed three times:
  the stored log has every line exactly once;
- agents take the settings of the server that calls them, and an agent an older corral
  left running is replaced once it runs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from livecorral import PYTHON, running, wait_until
from raycorral import (
    GPUS,
    RayNodes,
    RayServer,
    live_tasks,
    require_ray,
    stop_server,
    watched,
)

require_ray()

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from corral.cluster.ray_agent import NodeAgent  # noqa: E402
from corral.messages import AgentSettings  # noqa: E402

RAY_WORKERS = (("a", "r1"), ("b", "r1"), ("c", "r1"))
RANKS = str(Path(__file__).with_name("ranks.py"))
# The defaults of `corral server --ray`: what users get.
LOSS, FENCE = 10.0, 4.0


@pytest.fixture(scope="module")
def server(ray_nodes: RayNodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayServer]:
    root = tmp_path_factory.mktemp("corral-faults")
    namespace = f"corral-faults-{os.getpid()}-{root.name}"
    shared = root / "shared"
    shared.mkdir()
    # Tasks write their records here, as their submitter (root in CI, else this user).
    (root / "records").mkdir()
    started = RayServer(
        root,
        0,
        address=ray_nodes.address,
        namespace=namespace,
        loss=LOSS,
        fence=FENCE,
        options=("--checkpoint-root", str(shared)),
    )
    try:
        started.start()
        started.queue("team", 6)
        wait_until(lambda: len(started.nodes()) == 3, 60, "the three nodes")
        yield started
    finally:
        stop_server(started, ray_nodes, root)


def records(server: RayServer, name: str) -> dict[tuple[int, int], dict[str, Any]]:
    """What each (rank, attempt) of the workload recorded."""
    found = {}
    for path in (server.data_dir / "records").glob(f"{name}-*-*.json"):
        with contextlib.suppress(OSError, ValueError):
            rank, attempt = path.stem.rsplit("-", 2)[1:]
            found[(int(rank), int(attempt))] = json.loads(path.read_text())
    return found


def ranks(server: RayServer, name: str) -> Any:
    stop = server.data_dir / f"{name}.stop"
    command = [PYTHON, RANKS, str(server.data_dir / "records"), str(stop)]
    return server.submit(name, "team", command, gpu=GPUS, replicas=2)


def progressing(server: RayServer, name: str, attempt: int) -> dict[int, dict[str, Any]]:
    """Wait until both ranks of `attempt` run and checkpointed past where they resumed."""

    def check() -> dict[int, dict[str, Any]] | None:
        found = {rank: r for (rank, a), r in records(server, name).items() if a == attempt}
        moved = len(found) == 2 and all(r["checkpoint"] > r["start"] for r in found.values())
        return found if moved else None

    found: dict[int, dict[str, Any]] = wait_until(check, 90, f"attempt {attempt} to progress")
    return found


def finish(server: RayServer, name: str) -> Any:
    (server.data_dir / f"{name}.stop").touch()
    return server.wait_status(name, timeout=60)


def test_a_lost_node_requeues_a_real_gang_every_time_and_it_resumes(
    server: RayServer, ray_nodes: RayNodes
) -> None:
    try:
        ranks(server, "lossy")
        with watched("lossy") as twice:
            for attempt in range(1, 6):
                before = progressing(server, "lossy", attempt)
                # Rank 1's node, then rank 0's: either side may see its peer vanish.
                nodes = {p["task"]: p["node"] for p in server.workload("lossy")["placements"]}
                victim = nodes[attempt % 2]
                removed = time.monotonic()
                ray_nodes.remove(victim)
                wait_until(
                    lambda a=attempt: server.workload("lossy")["attempts"] > a,
                    LOSS + 30,
                    f"attempt {attempt + 1} after {victim} was removed",
                )
                lost_after = time.monotonic() - removed
                assert server.nodes()[victim]["state"] == "unavailable"
                after = progressing(server, "lossy", attempt + 1)
                assert victim not in {p["node"] for p in server.workload("lossy")["placements"]}
                # The rank on the lost node was stopped by its own launcher: the fence.
                exits = (server.data_dir / "agents" / victim / "run").rglob("task-*.exit")
                assert any("fenced" in path.read_text() for path in exits), victim
                for rank in (0, 1):
                    # A rank resumes at its last checkpoint (never before it: work is lost only
                    # since then), taken by the attempt that ran when the node went; or at the
                    # one it was writing when it was killed.
                    last = records(server, "lossy")[(rank, attempt)]
                    resumable = {last["checkpoint"], last.get("checkpointing", last["checkpoint"])}
                    assert after[rank]["start"] in resumable, (rank, last)
                    assert after[rank]["start"] >= before[rank]["checkpoint"], (rank, last)
                assert lost_after < LOSS + 20, lost_after
                ray_nodes.add(f"n{attempt}", "r1")
                wait_until(lambda n=f"n{attempt}": n in server.nodes(), 60, "the new node")
            done = finish(server, "lossy")
        assert done["status"] == "succeeded", (done["reason"], server.events("lossy"))
        assert done["attempts"] == 6
        assert not twice, f"a rank ran twice at once: {twice}"
        kinds = [event["kind"] for event in server.events("lossy")]
        assert "failed" not in kinds and "retrying" not in kinds, kinds
        requeued = server.events("lossy", "requeued")
        assert len(requeued) == 5, requeued
        for event in requeued:
            assert re.search(r"node \S+ was lost \(no answer for \d+ s\)", event["reason"]), event
    finally:
        # A failure here leaves the next tests the cluster they expect: its three nodes,
        # and none of their GPUs held.
        with server.client() as client:
            client.delete("/workloads/lossy")
        while len(ray_nodes.workers) < 3:
            ray_nodes.add(f"spare{len(ray_nodes.workers)}", "r1")
        wait_until(lambda: len(live(server)) == 3, 60, "three live nodes")


def live(server: RayServer) -> list[str]:
    return [name for name, node in server.nodes().items() if node["state"] != "unavailable"]


def test_a_server_down_for_30_s_stops_nothing(server: RayServer) -> None:
    ranks(server, "steady")
    before = progressing(server, "steady", 1)
    # Seen from outside: inside, a task's pid is its own namespace's.
    pids = dict(live_tasks("steady"))
    assert len(pids) == 2, pids
    server.kill9()
    time.sleep(30)
    assert all(running(pid) for pid in pids.values()), "a rank stopped with the server"
    server.start()
    # A restarted server declares no node lost within a loss timeout of its start: let it
    # pass, and more.
    time.sleep(LOSS + 5)
    workload = server.workload("steady")
    assert workload["status"] == "running" and workload["attempts"] == 1, workload
    after = records(server, "steady")
    assert set(after) == {(0, 1), (1, 1)}
    assert {rank: r["run"] for (rank, _), r in after.items()} == {
        rank: r["run"] for rank, r in before.items()
    }
    assert dict(live_tasks("steady")) == pids
    # They went on meanwhile.
    assert all(after[(rank, 1)]["checkpoint"] > before[rank]["checkpoint"] for rank in (0, 1))
    done = finish(server, "steady")
    assert done["status"] == "succeeded" and done["attempts"] == 1, done
    kinds = {event["kind"] for event in server.events("steady")}
    assert not kinds & {"requeued", "failed", "retrying"}, kinds


COUNTER = """import sys, time
for i in range(int(sys.argv[1])):
    print(f"line {i}", flush=True)
    time.sleep(0.01)
"""


def test_no_line_is_lost_or_doubled_across_three_server_kills(server: RayServer) -> None:
    lines = 2500  # some 30 s of output at 10 ms a line (more on a loaded machine)
    server.submit("counter", "team", [PYTHON, "-c", COUNTER, str(lines)], gpu=1)
    server.wait_status("counter", "running", timeout=60)
    for _ in range(3):
        wait_until(lambda: "line" in server.log_text("counter"), 60, "more output")
        time.sleep(1)
        server.kill9()
        server.start()
    done = server.wait_status("counter", timeout=120)
    assert done["status"] == "succeeded", done

    def complete() -> str | None:
        text = server.log_text("counter")
        return text if f"line {lines - 1}\n" in text else None

    text = wait_until(complete, 30, "the whole log")
    assert text.splitlines() == [f"line {i}" for i in range(lines)]


class OldAgent(NodeAgent):
    """An agent as an older corral left it running: it speaks protocol 2 (no settings, no
    receipts) and takes no settings."""

    def hello(self) -> dict[str, Any]:
        return {**super().hello(), "protocol": 2}

    def drain(self, wait: float = 0.0) -> dict[str, Any]:  # type: ignore[override]
        return super().drain(wait)


def test_agents_take_new_settings_and_an_older_agent_is_replaced(
    ray_nodes: RayNodes, tmp_path: Path
) -> None:
    import ray
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    namespace = f"corral-settings-{os.getpid()}"
    # A node of the module's cluster (the test of lost nodes replaced some).
    name = sorted(ray_nodes.workers)[0]
    node = next(n for n in ray.nodes() if n["Alive"] and n["Labels"].get("corral.io/name") == name)
    agents = tmp_path / "agents"
    old = (
        ray.remote(OldAgent)
        .options(
            name=f"agent-{node['NodeID']}",
            namespace=namespace,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        )
        .remote(name, str(agents), AgentSettings(fence_timeout=9.0), GPUS)
    )
    first_pid = ray.get(old.hello.remote(), timeout=60)["pid"]
    first = RayServer(tmp_path, 0, address=ray_nodes.address, namespace=namespace)
    try:
        first.start()
        lease = agents / name / "lease"
        # The older agent runs nothing: it is replaced, and the new one takes the settings.
        wait_until(
            lambda: f"replacing the outdated agent of node {name}" in first.log.read_text(),
            60,
            "the replacement",
        )
        said = first.log.read_text()
        assert f"the agent of node {name} is of an older corral (protocol 2" in said
        wait_until(
            lambda: lease.read_text().strip() == f"{first.fence:g}", 60, "the new agent's settings"
        )
        pid = ray.get(
            ray.get_actor(f"agent-{node['NodeID']}", namespace=namespace).hello.remote(), timeout=30
        )["pid"]
        assert pid != first_pid
        # A server restarted with another fence timeout gives it to the agent it finds.
        first.kill9()
        first.fence = first.fence + 3
        first.loss = first.loss + 3
        first.start()
        wait_until(
            lambda: lease.read_text().strip() == f"{first.fence:g}", 60, "the changed settings"
        )
    finally:
        stop_server(first, ray_nodes, tmp_path)
