"""Crash safety: `kill -9` in the middle of a burst of submissions loses nothing that was
acknowledged, duplicates nothing, leaves the store sound, and the restarted server goes on
scheduling as before. On SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx
from server_support import Api, checked, wait_for

from corral.model.spec import short_name
from corral.store import Store, database_url

THREADS = 8
PER_THREAD = 40
KILL_AFTER = 120  # acknowledged submissions before the kill, out of THREADS * PER_THREAD
GPUS = 8
SHARE = 0.25  # each workload asks a quarter GPU, so 32 run at once and the rest wait


def _burst(server: Any, project: str, pool: str) -> tuple[dict[str, str], set[str]]:
    """Submit from THREADS clients at once and kill the server with SIGKILL once
    KILL_AFTER submissions were acknowledged. Returns the acknowledged submissions
    (sequence tag -> workload name) and every tag that was sent, answered or not."""
    acknowledged: dict[str, str] = {}
    sent: set[str] = set()
    refused: list[str] = []
    lock = threading.Lock()
    enough = threading.Event()
    start = threading.Barrier(THREADS + 1)

    def submitter(thread: int) -> None:
        with server.client() as client:
            start.wait()
            for number in range(PER_THREAD):
                tag = f"{thread}-{number}"
                body = {
                    "project": project,
                    "tasks": [{"gpu": SHARE}],
                    "node_selector": {"pool": pool},
                    "env": {"SEQ": tag},
                }
                if thread % 2:  # half named by the client, half by the server
                    body["name"] = f"burst-{tag}"
                with lock:
                    sent.add(tag)
                try:
                    response = client.post("/workloads", json=body, timeout=10)
                except httpx.TransportError:
                    return  # the server is gone; what was in flight may or may not be in
                with lock:
                    if response.status_code != 201:
                        refused.append(f"{tag}: {response.status_code} {response.text}")
                        continue
                    acknowledged[tag] = response.json()["name"]
                    if len(acknowledged) >= KILL_AFTER:
                        enough.set()

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    start.wait()
    assert enough.wait(60), "the burst did not reach the kill point"
    server.kill()
    for thread in threads:
        thread.join(60)
    assert refused == []
    return acknowledged, sent


def _check_store(server: Any, acknowledged: dict[str, str], sent: set[str]) -> int:
    """Every acknowledged submission exactly once, nothing unknown, nothing twice, no
    half-written workload, and the store's own integrity check clean. Returns how many
    workloads the store holds."""
    store = Store(database_url(server.data_dir, server.db))
    try:
        assert store.integrity_problems() == []
        workloads = store.list_workloads()
        tags = Counter(record.spec.env.get("SEQ") for record in workloads)
        assert set(tags) <= sent, set(tags) - sent
        assert [tag for tag, count in tags.items() if count > 1] == []
        names = {record.spec.env["SEQ"]: short_name(record.name) for record in workloads}
        for tag, name in acknowledged.items():
            assert names.get(tag) == name, f"acknowledged {tag} ({name}) is missing"
        # Each workload came with its event, in the same transaction.
        submitted = Counter(
            short_name(e.workload or "")
            for e in store.events(limit=100_000)
            if e.kind == "submitted"
        )
        assert submitted == Counter(names.values())
        for record in workloads:
            assert record.status in ("pending", "running"), record
            assert (record.status == "running") == bool(record.placements), record
        return len(workloads)
    finally:
        store.close()


def test_kill_9_during_a_burst_of_submissions(live_server: Any) -> None:
    api = Api(live_server)
    project = api.queue("crash", deserved=GPUS)["name"]
    pool = "crash"
    api.node(pool, gpus=GPUS)
    api.close()

    acknowledged, sent = _burst(live_server, project, pool)
    assert len(acknowledged) >= KILL_AFTER
    assert len(sent) < THREADS * PER_THREAD, "the kill came after the burst, not during it"
    present = _check_store(live_server, acknowledged, sent)

    live_server.restart()
    api = Api(live_server)
    try:
        capacity = int(GPUS / SHARE)
        expected_running = min(capacity, present)

        def settled() -> dict[str, Any] | None:
            summary = api.admin.get("/cluster").json()
            return summary if summary["workloads"]["running"] == expected_running else None

        summary = wait_for(settled, f"{expected_running} workloads running after the restart")
        assert summary["workloads"]["pending"] == present - expected_running
        assert summary["gpus_allocated"] == expected_running * SHARE
        assert _check_store(live_server, acknowledged, sent) == present

        # It goes on scheduling: free some devices and the waiting work takes them.
        running = api.admin.get("/workloads", params={"status": "running"}).json()
        for workload in running[:4]:
            assert api.admin.delete(f"/workloads/{workload['name']}").status_code == 204
        fresh = api.submit(project, pool, gpu=SHARE, priority="inference")
        api.wait_status(fresh["name"], "running")
        if present - expected_running >= 4:
            wait_for(settled, "the freed devices to be taken again")
        with checked(live_server.client()) as client:
            assert client.get("/whoami").status_code == 200
    finally:
        api.close()
