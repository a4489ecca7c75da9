"""Checkpoint times over Ray: a task on a remote node says it checkpointed
(`corral.sdk.checkpointed()`), its node's agent buffers the time for the server's next
drain, and the server keeps it for the workload."""

from __future__ import annotations

from livecorral import PYTHON, wait_until
from raycorral import GPUS, RayServer, require_ray

require_ray()

TOLD = """
import time
from corral.sdk import checkpointed
assert checkpointed()
print("checkpointed", flush=True)
time.sleep(600)
"""


def test_a_checkpoint_on_a_ray_node_reaches_the_server(ray_server: RayServer) -> None:
    wait_until(lambda: len(ray_server.nodes()) == 3, 30, "the three worker nodes")
    ray_server.queue("team", 3 * GPUS)
    ray_server.submit("told", "team", [PYTHON, "-c", TOLD], gpu=1)
    ray_server.wait_status("told", "running", timeout=60)
    ray_server.wait_log("told", "checkpointed", timeout=60)
    at = wait_until(lambda: ray_server.workload("told")["checkpoint_at"], 60, "the checkpoint time")
    started = ray_server.events("told", "task-started")
    assert started and at >= started[0]["time"] - 5
    with ray_server.client() as client:
        assert client.post("/workloads/told/cancel").status_code == 200
    ray_server.wait_status("told", "cancelled", timeout=60)
