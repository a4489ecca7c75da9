"""Helpers for tests against a real `corral server`: checked clients, unique names, polling.

Several tests share one server per backend, so every helper makes names that no other
test uses, and nodes carry a `pool` label of their own: a test that submits with that
pool as its node selector only ever lands on its own nodes.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
_counter = itertools.count(1)
# Words that only a leaked traceback or a stack dump would put in a response body.
TRACEBACK_MARKERS = ("Traceback (most recent call last)", 'File "', "sqlalchemy.", "psycopg.")


def unique(prefix: str) -> str:
    """A name valid for queues, nodes and workloads, different on every call."""
    return f"{prefix}-{os.getpid() % 10000}-{next(_counter)}"


def no_traceback(response: httpx.Response) -> None:
    """Response hook: an error body never carries a traceback or driver internals."""
    if response.status_code >= 400:
        response.read()
        for marker in TRACEBACK_MARKERS:
            assert marker not in response.text, (
                f"{response.request.method} {response.request.url} -> {response.status_code} "
                f"leaks {marker!r}: {response.text[:2000]}"
            )


def checked(client: httpx.Client) -> httpx.Client:
    client.event_hooks["response"].append(no_traceback)
    return client


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 15.0) -> T:
    """Call `probe` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def locs(response: httpx.Response) -> list[tuple[Any, ...]]:
    """The `loc` of every entry of a 422 body."""
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail, response.text
    for entry in detail:
        assert entry["msg"], entry
    return [tuple(entry["loc"]) for entry in detail]


def names_field(response: httpx.Response, *path: Any) -> bool:
    """True when some entry of a 422 body has a `loc` starting with ("body", *path)."""
    wanted = ("body", *path)
    return any(loc[: len(wanted)] == wanted for loc in locs(response))


class Api:
    """An admin's view of one server, with shortcuts for what most tests set up."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.admin = checked(server.client())

    def client(self, token: str | None = None) -> httpx.Client:
        return checked(self.server.client(token))

    def close(self) -> None:
        self.admin.close()

    def queue(self, prefix: str = "q", **fields: Any) -> dict[str, Any]:
        body = {"name": unique(prefix), "deserved": 8, **fields}
        response = self.admin.post("/queues", json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def node(self, pool: str, gpus: int = 4, **fields: Any) -> dict[str, Any]:
        labels = {"pool": pool, **fields.pop("labels", {})}
        body = {"name": unique("node"), "gpus": gpus, "labels": labels, **fields}
        response = self.admin.post("/nodes", json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def submit(
        self,
        project: str,
        pool: str,
        gpu: float = 1,
        replicas: int = 1,
        client: httpx.Client | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        body = {
            "project": project,
            "tasks": [{"gpu": gpu, "replicas": replicas}],
            "node_selector": {"pool": pool},
            **fields,
        }
        response = (client or self.admin).post("/workloads", json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def workload(self, name: str) -> dict[str, Any]:
        response = self.admin.get(f"/workloads/{name}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_status(self, name: str, status: str, timeout: float = 15.0) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            workload = self.workload(name)
            return workload if workload["status"] == status else None

        return wait_for(probe, f"{name} to be {status}", timeout)

    def wait_considered(self, name: str, timeout: float = 15.0) -> dict[str, Any]:
        """Wait until a cycle has looked at a pending workload and left it pending with a
        reason: evidence that the scheduler decided not to bind it."""

        def probe() -> dict[str, Any] | None:
            workload = self.workload(name)
            assert workload["status"] == "pending", workload
            return workload if workload["reason"] else None

        return wait_for(probe, f"a pending reason for {name}", timeout)
