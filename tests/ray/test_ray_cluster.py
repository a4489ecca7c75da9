"""corral on a real local Ray cluster: nodes join with their labels, gangs span nodes,
logs come back from remote nodes, topology labels steer placement, a restarted server
adopts every task, a new node gets waiting work, a lost node's gang is requeued whole
and never runs twice."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from livecorral import CORRAL, PYTHON, wait_until
from raycorral import GPUS, RayServer, require_ray

require_ray()

# A task's command: write what it saw to RECORDS/<workload>-<rank>-<attempt>.json, then
# rank 0 listens on MASTER_PORT and the others connect to MASTER_ADDR:MASTER_PORT;
# then it sleeps argv[2] seconds and writes its end time.
GANG = r"""
import json, os, socket, sys, time
records, sleep = sys.argv[1], float(sys.argv[2])
keys = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
        "CUDA_VISIBLE_DEVICES", "CORRAL_ATTEMPT", "CORRAL_CHECKPOINT_DIR"]
seen = {k: os.environ.get(k) for k in keys}
seen["pid"] = os.getpid()
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
print(f"rank {seen['RANK']} on {seen['MASTER_ADDR']}:{seen['MASTER_PORT']}", flush=True)
json.dump(seen, open(path + ".json", "w"))
time.sleep(sleep)
seen["end"] = time.time()
json.dump(seen, open(path + ".json", "w"))
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


def test_nodes_join_with_devices_and_labels(ray_server: RayServer) -> None:
    nodes = wait_until(
        lambda: n if {"a", "b", "c"} <= set(n := ray_server.nodes()) else None,
        5,
        "the three worker nodes",
    )
    assert set(nodes) == {"a", "b", "c"}, "the head has no GPUs and is not a corral node"
    assert nodes["a"]["labels"] == {"rack": "r1"}
    assert nodes["c"]["labels"] == {"rack": "r2"}
    for node in nodes.values():
        assert node["gpus"] == GPUS
        assert node["state"] == "ready"
    ray_server.queue("team", 6)


def test_gang_spans_nodes_with_rendezvous_env(ray_server: RayServer) -> None:
    gang(ray_server, "spread", 3, 1)
    ray_server.wait_status("spread", "succeeded", timeout=60)
    records = seen(ray_server, "spread")
    assert set(records) == {(0, 1), (1, 1), (2, 1)}
    where = {e["node"] for e in ray_server.events("spread", "task-started")}
    assert where == {"a", "b", "c"}
    addresses = {"a": "127.0.0.2", "b": "127.0.0.3", "c": "127.0.0.4"}
    rank0 = [
        e["node"] for e in ray_server.events("spread", "task-started") if "task 0 " in e["reason"]
    ]
    master = records[(0, 1)]["MASTER_ADDR"]
    assert master == addresses[rank0[0]]
    ports = {r["MASTER_PORT"] for r in records.values()}
    assert len(ports) == 1
    for rank in range(3):
        record = records[(rank, 1)]
        assert record["WORLD_SIZE"] == "3"
        assert record["LOCAL_RANK"] == "0"
        assert record["NODE_RANK"] == str(rank)
        assert record["CUDA_VISIBLE_DEVICES"] == "0,1"
    # Ranks 1 and 2 really reached rank 0 on its node.
    assert records[(0, 1)]["peers"] == ["rank 1", "rank 2"]
    assert records[(1, 1)]["connected"] == f"{master}:{ports.pop()}"
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
