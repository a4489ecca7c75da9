"""Fixtures for the Ray tests (see raycorral): a module's Ray cluster and its server."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from raycorral import RayNodes, RayServer, free_port, stop_server

# The worker nodes of a module's cluster, (name, rack) each; a module that needs fewer
# sets RAY_WORKERS (every node is a Ray process, and the machine has few cores).
WORKERS = (("a", "r1"), ("b", "r2"), ("c", "r2"))


@pytest.fixture(scope="module")
def ray_nodes(request: pytest.FixtureRequest) -> Iterator[RayNodes]:
    """A head and worker nodes a (rack r1), b and c (rack r2), shared by a module."""
    import ray
    from ray.cluster_utils import Cluster

    from corral.cluster.ray import connect

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "node_ip_address": "127.0.0.1",
            "gcs_server_port": free_port(),
            "include_dashboard": False,
            # A dead raylet is noticed in ~3 s instead of ~15 s.
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        },
    )
    nodes = RayNodes(cluster)
    try:
        for name, rack in getattr(request.module, "RAY_WORKERS", WORKERS):
            nodes.add(name, rack)
        connect(cluster.address, 30)
        yield nodes
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def ray_server(
    ray_nodes: RayNodes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RayServer]:
    """A corral server on the module's Ray cluster, shared by its tests."""
    root = tmp_path_factory.mktemp("corral-ray")
    namespace = f"corral-test-{os.getpid()}-{root.name}"
    server = RayServer(root, 0, address=ray_nodes.address, namespace=namespace)
    try:
        server.start()
        yield server
    finally:
        stop_server(server, ray_nodes, root)
