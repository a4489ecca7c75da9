"""GET /workloads/NAME?until=STATUS: the answer comes once the workload is in that status
or has ended, or when `wait` seconds have passed. A binding wakes the request at once
(the scheduler in this process, and in a child process as `corral server` runs it); a
change no one announces is seen within a second. In-process servers on a real store
(both backends), through Starlette's test client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_support import Api, unique

import corral.api.routers.workloads as workloads_router
import corral.control.watch as watch
from corral.agent import Agent
from corral.cluster.local import LocalCluster
from corral.control.plane import ControlPlane
from corral.model import Node, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.sdk.client import Client as SdkClient
from corral.server.app import create_app
from corral.store import Store

API = "/api/v1"


def spec(name: str, project: str = "team") -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        project=project,
        user="admin",
        task_groups=(TaskGroup("main", 1, 1.0),),
        command=("true",),
    )


class Waiting:
    """A GET /workloads/NAME?... sent from a thread of its own. Asked to wait longer
    than the test's `patience`, it has a result only if the server answered before the
    wait ran out: woken, not at the deadline."""

    def __init__(
        self,
        client: TestClient,
        name: str,
        token: str | None = None,
        patience: float = 20.0,
        **params: Any,
    ) -> None:
        self.answer: Any = None
        self.patience = patience
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.thread = threading.Thread(
            target=self._get, args=(client, name, params, headers), daemon=True
        )
        self.thread.start()

    def _get(
        self,
        client: TestClient,
        name: str,
        params: dict[str, Any],
        headers: dict[str, str] | None,
    ) -> None:
        url = f"{API}/workloads/{name}"
        self.answer = client.get(url, params=params, headers=headers)

    def result(self) -> Any:
        # The test client applies no timeout of its own: the thread is what waits.
        self.thread.join(self.patience)
        assert self.answer is not None, f"no answer within {self.patience:g} s"
        assert self.answer.status_code == 200, self.answer.text
        return self.answer.json()


def background_of(client: TestClient) -> ControlPlane:
    found: ControlPlane = client.app.state.control  # type: ignore[attr-defined]
    return found


def waiting_requests(client: TestClient, count: int) -> None:
    deadline = time.monotonic() + 30
    while background_of(client).changes.waiting() != count:
        assert time.monotonic() < deadline, "the request never waited"
        time.sleep(0.02)


@pytest.fixture(params=["loop", "child"])
def client(request: pytest.FixtureRequest, store: Store) -> Iterator[TestClient]:
    """The application with the scheduler in this process or in a child process, and
    the admin's token; a project with room for one GPU, and no node yet."""
    token = store.ensure_admin()
    store.create_queue(Queue("team", deserved=Resources(gpu=1)))
    app = create_app(store, scheduler_process=request.param == "child", interval=0.2)
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as made:
        yield made


def test_a_request_waiting_for_running_is_woken_by_the_binding(
    client: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No second look within the wait: only the binding's wake-up can answer `running`.
    monkeypatch.setattr(workloads_router, "RECHECK_SECONDS", 600.0)
    store.submit(spec("w"))
    waiting = Waiting(client, "w", until="running", wait=50)
    waiting_requests(client, 1)
    answer = client.post(f"{API}/nodes", json={"name": "n0", "gpus": 1})
    assert answer.status_code == 201, answer.text
    found = waiting.result()
    assert found["status"] == "running", found
    assert background_of(client).changes.waiting() == 0


def test_a_request_waits_no_longer_than_asked_and_says_what_it_found(
    client: TestClient, store: Store
) -> None:
    store.submit(spec("w"))
    sent = time.monotonic()
    answer = client.get(f"{API}/workloads/w", params={"until": "running", "wait": 0.5})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "pending"
    assert time.monotonic() - sent >= 0.5
    # In that status already: at once.
    answer = client.get(f"{API}/workloads/w", params={"until": "pending", "wait": 60})
    assert answer.json()["status"] == "pending"


def test_a_workload_that_ends_answers_a_wait_for_another_status(
    client: TestClient, store: Store
) -> None:
    store.submit(spec("w"))
    # The wait is longer than the client's patience: only the end can answer in time.
    waiting = Waiting(client, "w", until="running", wait=60)
    waiting_requests(client, 1)
    answer = client.post(f"{API}/workloads/w/cancel")
    assert answer.status_code == 200, answer.text
    assert waiting.result()["status"] == "cancelled"


def test_a_wait_is_checked_and_sees_only_what_its_caller_may(
    client: TestClient, store: Store
) -> None:
    store.submit(spec("w"))
    for params, field in (
        ({"wait": 1}, "wait"),
        ({"until": "running", "wait": 0}, "wait"),
        ({"until": "running", "wait": 61}, "wait"),
        ({"until": "started"}, "until"),
    ):
        answer = client.get(f"{API}/workloads/w", params=params)
        assert answer.status_code == 422, (params, answer.text)
        assert field in answer.text, (params, answer.text)
    # Another project's member waits for nothing: the workload does not exist for it.
    store.create_queue(Queue("other", deserved=Resources(gpu=1)))
    _, token = store.create_user("mallory", "member", "other")
    answer = client.get(
        f"{API}/workloads/w",
        params={"until": "running", "wait": 30},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 404, answer.text
    assert background_of(client).changes.waiting() == 0
    answer = client.get(f"{API}/workloads/gone", params={"until": "running"})
    assert answer.status_code == 404, answer.text


def test_a_user_has_only_so_many_requests_waiting_and_the_next_is_answered_at_once(
    client: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch, "MAX_WAITING", 1)
    store.submit(spec("w"))
    waiting = Waiting(client, "w", until="running", wait=50)
    waiting_requests(client, 1)
    # Beyond the cap: answered long before its wait (nothing changes meanwhile), as it is.
    over = Waiting(client, "w", until="running", wait=50)
    assert over.result()["status"] == "pending"
    assert background_of(client).changes.waiting() == 1
    # Another user's request waits beside it.
    _, token = store.create_user("viewer", "viewer", None)
    beside = Waiting(client, "w", until="running", wait=50, token=token)
    waiting_requests(client, 2)
    assert client.post(f"{API}/nodes", json={"name": "n0", "gpus": 1}).status_code == 201
    assert waiting.result()["status"] == "running"
    assert beside.result()["status"] == "running"


def test_the_sdk_waits_for_a_submission_to_start(api: Api) -> None:
    # A real `corral server` (its scheduler in a child process), through the SDK.
    project = api.queue("watch")["name"]
    pool = unique("pool")
    with SdkClient(api.server.url, api.server.token) as sdk:
        body = {"project": project, "tasks": [{"gpu": 1}], "node_selector": {"pool": pool}}
        name = sdk.submit({**body, "command": ["true"]})["name"]
        assert sdk.wait_workload(name, "running", 0.2)["status"] == "pending"
        api.node(pool, gpus=1)
        assert sdk.wait_workload(name, "running", 30)["status"] == "running"


def test_a_task_end_taken_in_wakes_a_request_waiting_for_the_end(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a cluster (an agent in this process) the agents' reports wake waiting
    # requests too; with no second look, only that can answer `succeeded` in time.
    monkeypatch.setattr(workloads_router, "RECHECK_SECONDS", 600.0)
    token = store.ensure_admin()
    store.create_queue(Queue("team", deserved=Resources(gpu=1)))
    device = Device(0, "n0-0", "virtual", 80 << 30, True)
    store.register_node(NodeSpec(Node("n0", gpus=1), (device,), virtual=True))
    agent = Agent(
        "n0",
        tmp_path / "agent",
        poll_interval=0.05,
        devices=(device,),
        workloads_dir=tmp_path / "workloads",
        run_as_submitter=False,
    )
    app = create_app(store, cluster=LocalCluster([agent]), data_dir=tmp_path, interval=0.2)
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        body = {"project": "team", "name": "short", "tasks": [{"gpu": 1}]}
        answer = client.post(f"{API}/workloads", json={**body, "command": ["sleep", "1"]})
        assert answer.status_code == 201, answer.text
        found = Waiting(client, "short", until="running", wait=50).result()
        assert found["status"] == "running", found
        found = Waiting(client, "short", until="succeeded", wait=50).result()
        assert found["status"] == "succeeded", found
