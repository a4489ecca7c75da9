"""Declarations of lost nodes, kept in Ray's control store (GCS) where every agent reads.

The server declares a node lost when its agent has not answered for the loss timeout.
Mostly the node is cut off from the whole cluster, and its launchers have fenced their
tasks already. But an agent that still reaches Ray while the server's calls do not reach
it (a hung actor call, a one-sided partition) would keep its tasks running while the
server starts them elsewhere: so the declaration is written where such an agent looks
every second (`LostMarker`, its watchdog's probe), and it kills what it ran before then.

The value is the time of the declaration by the server's clock, which is also the clock
of every launch's `decided_at`: a task launched on the node after it came back is newer
and stays. Importing this module does not import Ray; calling it does.
"""

from __future__ import annotations

from typing import Any

# Seconds a probe waits for the GCS: a cluster that does not answer in that time counts
# as cut off (the lease is not renewed by this probe).
PROBE_TIMEOUT = 2.0


def _namespace(namespace: str) -> bytes:
    return f"corral-{namespace}".encode()


def _key(node: str) -> bytes:
    return f"lost/{node}".encode()


def declare_lost(namespace: str, nodes: list[str], at: float) -> None:
    """Record in the GCS that the server declared `nodes` lost at `at`."""
    from ray.experimental.internal_kv import _internal_kv_put

    for node in nodes:
        _internal_kv_put(_key(node), repr(at).encode(), namespace=_namespace(namespace))


class LostMarker:
    """An agent's probe (see corral.cluster.ray_agent): when the server last declared its
    node lost, None if never; raises when the GCS does not answer within PROBE_TIMEOUT."""

    def __init__(self, namespace: str, node: str) -> None:
        self.namespace = _namespace(namespace)
        self.key = _key(node)

    def __call__(self) -> float | None:
        import ray

        # The worker's own GCS client: the public internal_kv functions take no timeout,
        # and a probe that hangs would be no probe.
        client: Any = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
        value = client.internal_kv_get(self.key, self.namespace, timeout=PROBE_TIMEOUT)
        if not value:
            return None
        try:
            return float(value)
        except ValueError:
            return None
