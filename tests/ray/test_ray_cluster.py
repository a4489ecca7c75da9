"""corral on a real local Ray cluster: nodes join with their labels, gangs span nodes,
logs come back from remote nodes, topology labels steer placement, a restarted server
adopts every task, a new node gets waiting work. (A lost node: tests/ray/test_ray_faults.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from livecorral import CORRAL, PYTHON, wait_until
from raycorral import GPUS, RayNodes, RayServer, require_ray, without_containers

from corral.agent.containers import probe
from corral.model.spec import CONTAINERS_LABEL, CONTAINERS_VALUE

require_ray()

# A task's command: write what it saw to RECORDS/<workload>-<rank>-<attempt>.json, then
# rank 0 listens on MASTER_PORT and the others connect to MASTER_ADDR:MASTER_PORT;
# then it sleeps argv[2] seconds (argv[3] on later attempts) and writes its end time.
GANG = r"""
import json, os, socket, sys, time
records, sleep = sys.argv[1], float(sys.argv[2])
if len(sys.argv) > 3 and os.environ["CORRAL_ATTEMPT"] != "1":
    sleep = float(sys.argv[3])
keys = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
        "CUDA_VISIBLE_DEVICES", "CORRAL_ATTEMPT", "CORRAL_CHECKPOINT_DIR"]
seen = {k: os.environ.get(k) for k in keys}
seen["run"] = os.urandom(8).hex()  # this process's run (a task's pid is its namespace's)
seen["start"] = time.time()
path = f"{records}/{os.environ['CORRAL_WORKLOAD']}-{seen['RANK']}-{seen['CORRAL_ATTEMPT']}"
world = int(seen["WORLD_SIZE"])
if world > 1:
    addr, port = seen["MASTER_ADDR"], int(seen["MASTER_PORT"])
    if seen["RANK"] == "0":
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((addr, port))
        server.listen()
        server.settimeout(60)
        peers = []
        for _ in range(world - 1):
            conn, _ = server.accept()
            peers.append(conn.recv(64).decode())
        seen["peers"] = sorted(peers)
    else:
        deadline = time.time() + 60
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        conn.sendall(f"rank {seen['RANK']}".encode())
        seen["connected"] = f"{addr}:{port}"
def record():
    # Whole or not at all: the test reads the records while tasks write them.
    with open(path + ".tmp", "w") as handle:
        json.dump(seen, handle)
    os.replace(path + ".tmp", path + ".json")
print(f"rank {seen['RANK']} on {seen['MASTER_ADDR']}:{seen['MASTER_PORT']}", flush=True)
record()
time.sleep(sleep)
seen["end"] = time.time()
record()
print(f"rank {seen['RANK']} done", flush=True)
"""


def records(server: RayServer) -> Path:
    path = server.data_dir / "records"
    path.mkdir(exist_ok=True)
    return path


def gang(server: RayServer, name: str, replicas: int, sleep: float, **more: Any) -> Any:
    command = [PYTHON, "-c", GANG, str(records(server)), str(sleep)]
    return server.submit(name, "team", command, gpu=GPUS, replicas=replicas, **more)


def seen(server: RayServer, name: str) -> dict[tuple[int, int], dict[str, Any]]:
    """What each (rank, attempt) of a workload saw."""
    found = {}
    for path in records(server).glob(f"{name}-*.json"):
        with open(path) as handle:
            record = json.load(handle)
        found[(int(record["RANK"]), int(record["CORRAL_ATTEMPT"]))] = record
    return found


def placements(server: RayServer, name: str) -> dict[int, str]:
    return {p["task"]: p["node"] for p in server.workload(name)["placements"]}


@pytest.fixture(scope="module", autouse=True)
def team(ray_server: RayServer) -> None:
    """The project that every test submits to, made before the first test: a test that
    fails must not fail the next ones for want of it."""
    ray_server.queue("team", 6)


def test_nodes_join_with_devices_and_labels(ray_server: RayServer) -> None:
    # Beside the other tests on a 2-core machine, a worker's agent took more than 5 s.
    nodes = wait_until(
        lambda: n if {"a", "b", "c"} <= set(n := ray_server.nodes()) else None,
        30,
        "the three worker nodes",
    )
    assert set(nodes) == {"a", "b", "c"}, "the head has no GPUs and is not a corral node"
    # Beside their Ray labels, the agents say whether they run tasks in images: as this
    # machine does (root, podman: as CI), once their probe has found out.
    containers = {CONTAINERS_LABEL: CONTAINERS_VALUE} if probe().available else {}

    def labelled() -> dict[str, Any] | None:
        found: dict[str, Any] = ray_server.nodes()
        told = all(CONTAINERS_LABEL in node["labels"] for node in found.values())
        return found if told or not containers else None

    nodes = wait_until(labelled, 30, "the nodes to say they run containers")
    assert nodes["a"]["labels"] == {"rack": "r1", **containers}
    assert nodes["c"]["labels"] == {"rack": "r2", **containers}
    for node in nodes.values():
        assert node["gpus"] == GPUS
        assert node["state"] == "ready"
    # Each worker's own loopback address (127.0.0.2, .3, .4): where the server reaches its
    # tasks (a workspace's ports), never this machine's 127.0.0.1.
    addresses = {node["address"] for node in nodes.values()}
    assert addresses == {"127.0.0.2", "127.0.0.3", "127.0.0.4"}


def test_gang_spans_nodes_with_rendezvous_env(ray_server: RayServer) -> None:
    gang(ray_server, "spread", 3, 1)
    ray_server.wait_status("spread", "succeeded", timeout=60)
    saw = seen(ray_server, "spread")
    assert set(saw) == {(0, 1), (1, 1), (2, 1)}
    where = {e["node"] for e in ray_server.events("spread", "task-started")}
    assert where == {"a", "b", "c"}
    addresses = {"a": "127.0.0.2", "b": "127.0.0.3", "c": "127.0.0.4"}
    rank0 = [
        e["node"] for e in ray_server.events("spread", "task-started") if "task 0 " in e["reason"]
    ]
    master = saw[(0, 1)]["MASTER_ADDR"]
    assert master == addresses[rank0[0]]
    ports = {r["MASTER_PORT"] for r in saw.values()}
    assert len(ports) == 1
    for rank in range(3):
        record = saw[(rank, 1)]
        assert record["WORLD_SIZE"] == "3"
        assert record["LOCAL_RANK"] == "0"
        assert record["NODE_RANK"] == str(rank)
        assert record["CUDA_VISIBLE_DEVICES"] == "0,1"
    # Ranks 1 and 2 really reached rank 0 on its node.
    assert saw[(0, 1)]["peers"] == ["rank 1", "rank 2"]
    assert saw[(1, 1)]["connected"] == f"{master}:{ports.pop()}"
    # The log of a task on a remote node reaches `corral logs`.
    out = subprocess.run(
        [CORRAL, "logs", "spread", "--task", "2"],
        capture_output=True,
        text=True,
        env={
            "CORRAL_SERVER": ray_server.url,
            "CORRAL_TOKEN": ray_server.token,
            "HOME": str(ray_server.data_dir),
        },
        timeout=30,
    )
    assert "rank 2 done" in out.stdout, out


def test_rack_label_steers_a_topology_gang(ray_server: RayServer) -> None:
    # Rack r1 has one node, r2 two: a 2-node gang that must stay in one rack goes to r2
    # (left alone, placement would take a and b, the first nodes by name).
    gang(ray_server, "racked", 2, 0.5, topology={"key": "rack", "required": True})
    ray_server.wait_status("racked", "succeeded", timeout=60)
    where = {e["node"] for e in ray_server.events("racked", "task-started")}
    assert where == {"b", "c"}


def test_a_deleted_workloads_logs_go_everywhere_and_its_name_starts_empty(
    ray_server: RayServer,
) -> None:
    first = ray_server.submit("reused", "team", [PYTHON, "-c", "print('first run')"], gpu=GPUS)
    ray_server.wait_log("reused", "first run", timeout=60)
    [node] = {e["node"] for e in ray_server.events("reused", "task-started")}
    directory = first["directory"]
    left = [
        ray_server.data_dir / "logs" / directory,  # shipped to the server
        ray_server.agent_dir / node / "logs" / directory,  # the node's own
        ray_server.agent_dir / node / "run" / directory,
        ray_server.agent_dir / f"{node}-workloads" / directory,
    ]
    ray_server.wait_status("reused", "succeeded", timeout=60)
    assert all(path.exists() for path in left), left
    with ray_server.client() as client:
        assert client.delete("/workloads/reused").status_code == 204
    wait_until(lambda: not any(path.exists() for path in left), 20, "its files to go")
    ray_server.submit("reused", "team", [PYTHON, "-c", "print('second run')"], gpu=GPUS)
    ray_server.wait_log("reused", "second run", timeout=60)
    assert ray_server.log_text("reused") == "second run\n"
    assert [e["kind"] for e in ray_server.events("reused")][:2] == ["submitted", "bound"]


def test_restarted_server_adopts_every_task(ray_server: RayServer) -> None:
    gang(ray_server, "adopted", 3, 12)
    wait_until(lambda: len(ray_server.events("adopted", "task-started")) == 3, 30, "3 starts")
    before = {r["RANK"]: r["run"] for r in wait_records(ray_server, "adopted", 3).values()}
    ray_server.kill9()
    ray_server.start()
    done = ray_server.wait_status("adopted", timeout=60)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 1
    assert len(ray_server.events("adopted", "task-started")) == 3, "a task started twice"
    after = seen(ray_server, "adopted")
    assert {r["RANK"]: r["run"] for r in after.values()} == before
    assert all("end" in record for record in after.values())


def wait_records(server: RayServer, name: str, count: int) -> dict[tuple[int, int], Any]:
    return wait_until(
        lambda: r if len(r := seen(server, name)) >= count else None, 30, f"{count} records"
    )


def test_a_new_node_joins_and_gets_the_waiting_work(
    ray_server: RayServer, ray_nodes: RayNodes
) -> None:
    gang(ray_server, "waits", 1, 0.5, node_selector={"rack": "r3"})
    time.sleep(2)
    assert ray_server.workload("waits")["status"] == "pending"
    joined = time.monotonic()
    ray_nodes.add("d", "r3")
    nodes = wait_until(lambda: n if "d" in (n := ray_server.nodes()) else None, 30, "node d")
    assert without_containers(nodes["d"]["labels"]) == {"rack": "r3"}
    started = wait_until(lambda: ray_server.events("waits", "task-started"), 30, "the start")
    # The Ray node itself takes a few seconds to start (20 s beside the other tests).
    assert time.monotonic() - joined < 45
    assert {e["node"] for e in started} == {"d"}
    # /metrics shows the new node's devices too.
    metrics = httpx.get(f"{ray_server.url}/metrics", timeout=10).text
    assert re.search(r'corral_node_gpus\{[^}]*node="d"[^}]*\} 2', metrics), metrics[:2000]
