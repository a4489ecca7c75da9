"""A workload's life after submission, against a real server on each backend: cancel
(one, or a whole array), update while pending, history (sacct), estimated starts
(squeue --start), arrays with a running limit, and dependencies.

No agent runs here: bound work stays running until cancelled, which is what lets these
tests pin the scheduler's side (limits, holds) without timing anything."""

from __future__ import annotations

import time
from typing import Any

from server_support import Api, names_field, unique, wait_for


def _users(api: Api, project: str) -> dict[str, Any]:
    """A member of `project` and their client."""
    name = unique("m")
    made = api.admin.post("/users", json={"name": name, "role": "member", "project": project})
    assert made.status_code == 201, made.text
    return {"name": name, "client": api.client(made.json()["token"])}


def test_cancel_keeps_a_cancelled_record_and_frees_the_devices(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()["name"]
    node = api.node(pool, gpus=2)["name"]
    running = api.submit(project, pool, gpu=2)["name"]
    api.wait_status(running, "running")
    waiting = api.submit(project, pool, gpu=2)["name"]
    api.wait_considered(waiting)

    response = api.admin.post(f"/workloads/{running}/cancel")
    assert response.status_code == 200, response.text
    [cancelled] = response.json()
    assert cancelled["name"] == running and cancelled["status"] == "cancelled"
    assert cancelled["cancelled_by"] == "admin" and cancelled["placements"] == []
    assert cancelled["finished_at"] >= cancelled["started_at"]
    assert cancelled["reason"] == "cancelled by admin"
    # Its GPUs went to the workload that waited for them.
    api.wait_status(waiting, "running")
    assert {t["workload"] for t in api.admin.get(f"/nodes/{node}").json()["tasks"]} == {waiting}

    again = api.admin.post(f"/workloads/{running}/cancel")
    assert again.status_code == 409 and "cancelled" in again.json()["detail"], again.text
    kinds = [e["kind"] for e in api.admin.get(f"/workloads/{running}/events").json()]
    assert kinds[-1] == "cancelled"
    # The record stays, and history shows it; delete removes it.
    rows = api.admin.get("/history", params={"project": project, "state": "cancelled"}).json()
    assert [row["name"] for row in rows] == [running]
    assert rows[0]["cancelled_by"] == "admin" and rows[0]["gpu_hours"] > 0
    assert api.admin.delete(f"/workloads/{running}").status_code == 204
    assert api.admin.get(f"/workloads/{running}").status_code == 404
    assert api.admin.post(f"/workloads/{unique('ghost')}/cancel").status_code == 404


def test_history_filters_and_columns(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()["name"]
    api.node(pool, gpus=1)
    member = _users(api, project)
    first = api.submit(project, pool, gpu=1, client=member["client"])["name"]
    api.wait_status(first, "running")
    second = api.submit(project, pool, gpu=1)["name"]
    api.wait_considered(second)
    time.sleep(0.05)
    rows = api.admin.get("/history", params={"project": project}).json()
    assert [row["name"] for row in rows] == [first, second]
    run, wait = rows
    assert run["state"] == "running" and run["user"] == member["name"]
    assert run["wait_seconds"] >= 0 and run["run_seconds"] > 0 and run["gpus"] == 1
    assert run["exit_code"] is None and run["attempts"] == 1 and run["evictions"] == 0
    assert wait["state"] == "pending" and wait["run_seconds"] is None
    assert wait["wait_seconds"] > 0 and wait["gpu_hours"] == 0
    only = api.admin.get("/history", params={"project": project, "user": member["name"]})
    assert [row["name"] for row in only.json()] == [first]
    later = api.admin.get("/history", params={"project": project, "since": time.time() + 60})
    # Unfinished work is always shown; finished work only when it ended since.
    assert [row["name"] for row in later.json()] == [first, second]
    api.admin.post(f"/workloads/{first}/cancel")
    later = api.admin.get("/history", params={"project": project, "since": time.time() + 60})
    assert [row["name"] for row in later.json()] == [second]
    assert api.admin.get("/history", params={"state": "done"}).status_code == 422
    assert api.admin.get("/history", params={"limit": 0}).status_code == 422
    assert api.admin.get("/history", params={"since": -1}).status_code == 422


def test_update_a_pending_workload_but_not_a_running_one(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()["name"]
    api.node(pool, gpus=1)
    # Not preemptible: the raised priority below would otherwise take its GPU.
    running = api.submit(project, pool, gpu=1, preemptible=False)["name"]
    api.wait_status(running, "running")
    waiting = api.submit(project, pool, gpu=1)["name"]
    api.wait_considered(waiting)

    response = api.admin.patch(
        f"/workloads/{waiting}", json={"priority": "inference", "max_runtime": "2h"}
    )
    assert response.status_code == 200, response.text
    changed = response.json()
    assert (changed["priority"], changed["max_runtime"], changed["status"]) == (
        125,
        7200,
        "pending",
    )
    events = api.admin.get(f"/workloads/{waiting}/events").json()
    assert events[-1]["kind"] == "updated" and "priority=125" in events[-1]["reason"]

    refused = api.admin.patch(f"/workloads/{running}", json={"priority": 100})
    assert refused.status_code == 409 and "running" in refused.json()["detail"], refused.text
    assert api.workload(running)["priority"] == 50
    for body, field in (
        ({"command": ["true"]}, "command"),
        ({"tasks": []}, "tasks"),
        ({"priority": "urgent"}, "priority"),
        ({"max_runtime": "soon"}, "max_runtime"),
        ({"backoff_limit": -1}, "backoff_limit"),
        ({"colour": "red"}, "colour"),
    ):
        bad = api.admin.patch(f"/workloads/{waiting}", json=body)
        assert names_field(bad, field), bad.text
    assert (
        "cannot change" in api.admin.patch(f"/workloads/{waiting}", json={"command": ["true"]}).text
    )
    assert api.admin.patch(f"/workloads/{waiting}", json={}).status_code == 422
    assert api.workload(waiting)["priority"] == 125


def test_an_array_runs_at_most_its_limit_and_is_cancelled_as_a_group(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()["name"]
    api.node(pool, gpus=8)
    name = unique("arr")
    first = api.submit(project, pool, gpu=1, name=name, array="0-5%2")
    assert first["name"] == f"{name}-0"
    assert first["array"] == {"name": name, "index": 0, "limit": 2}
    members = api.admin.get("/workloads", params={"array": name}).json()
    assert [m["name"] for m in members] == [f"{name}-{i}" for i in range(6)]
    assert [m["array"]["index"] for m in members] == list(range(6))

    def two_running() -> list[dict[str, Any]] | None:
        found = api.admin.get("/workloads", params={"array": name}).json()
        running = [m for m in found if m["status"] == "running"]
        return found if len(running) == 2 else None

    found = wait_for(two_running, "two members running")
    # 8 GPUs are free, yet only the first two (by index) run.
    assert [m["name"] for m in found if m["status"] == "running"] == [f"{name}-0", f"{name}-1"]
    for member in found[2:]:
        assert member["status"] == "pending"
        assert "at most 2 at once" in member["reason"], member
    # Other work on the same nodes is not held back by the array's limit.
    other = api.submit(project, pool, gpu=4)["name"]
    api.wait_status(other, "running")
    assert len([m for m in found if m["status"] == "running"]) == 2

    # Cancelling one running member lets the next one in.
    api.admin.post(f"/workloads/{name}-0/cancel")
    api.wait_status(f"{name}-2", "running")
    response = api.admin.post(f"/workloads/{name}/cancel")
    assert response.status_code == 200, response.text
    assert sorted(m["name"] for m in response.json()) == [f"{name}-{i}" for i in range(1, 6)]
    found = api.admin.get("/workloads", params={"array": name}).json()
    assert {m["status"] for m in found} == {"cancelled"}
    assert api.admin.post(f"/workloads/{name}/cancel").status_code == 409


def test_array_syntax_and_bounds_are_checked(api: Api) -> None:
    project = api.queue()["name"]
    base = {"project": project, "tasks": [{"gpu": 1}]}
    for array in ("0-", "5-1", "a", "1,,2", "0-3%0", "0-10000", "0-9%x", "1000000"):
        response = api.admin.post("/workloads", json={**base, "name": unique("a"), "array": array})
        assert names_field(response, "array"), (array, response.text)
    long = "x" * 60
    response = api.admin.post("/workloads", json={**base, "name": long, "array": "0-999"})
    assert response.status_code == 422 and "name" in response.text, response.text
    batch = {"workloads": [{**base, "array": "0-1"}]}
    response = api.admin.post("/workloads/batch", json=batch)
    assert response.status_code == 422 and "array" in response.text, response.text
    assert api.admin.get("/workloads", params={"project": project}).json() == []
    # An array's name is its own: no second array, no workload takes it.
    taken = unique("taken")
    api.submit(project, unique("nowhere"), gpu=1, name=taken, array="0-1")
    for body in ({"name": taken, "array": "5-6"}, {"name": taken}):
        response = api.admin.post("/workloads", json={**base, **body})
        assert response.status_code == 409 and "names an array" in response.text, response.text
    plain = api.submit(project, unique("nowhere"), gpu=1)["name"]
    response = api.admin.post("/workloads", json={**base, "name": plain, "array": "0"})
    assert response.status_code == 409, response.text
    # A drawn name works too.
    first = api.submit(project, unique("nowhere"), gpu=1, array="3,1")
    assert first["name"].endswith("-1") and first["array"]["index"] == 1


def test_dependencies_hold_work_until_met(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()["name"]
    api.node(pool, gpus=8)
    first = api.submit(project, pool, gpu=1)["name"]
    api.wait_status(first, "running")
    needs_ok = api.submit(project, pool, gpu=1, after=[first])["name"]
    needs_end = api.submit(project, pool, gpu=1, after=[f"{first}:any"])["name"]
    killed = api.submit(project, pool, gpu=1, after=[first], kill_on_invalid_dep=True)["name"]
    for name in (needs_ok, needs_end, killed):
        workload = api.workload(name)
        assert workload["status"] == "pending", workload
    # Reasons name workloads by their keys, PROJECT/NAME.
    assert api.workload(needs_ok)["reason"] == f"waiting for {project}/{first} to succeed"
    assert api.workload(needs_end)["reason"] == f"waiting for {project}/{first} to end"
    assert api.workload(needs_ok)["after"] == [f"{first}:ok"]
    why = api.admin.get(f"/workloads/{needs_ok}/why").json()
    assert why["reason"] == f"waiting for {project}/{first} to succeed"

    # Cancelled: `any` is met, `ok` never will be.
    api.admin.post(f"/workloads/{first}/cancel")
    api.wait_status(needs_end, "running")
    done = api.wait_status(killed, "cancelled")
    assert (
        done["reason"] == f"cancelled: dependency {project}/{first} cancelled; it can never succeed"
    )
    assert done["cancelled_by"] == "scheduler"

    def blocked() -> dict[str, Any] | None:
        workload = api.workload(needs_ok)
        return workload if "never" in (workload["reason"] or "") else None

    stuck = wait_for(blocked, "the reason of a dependency that can never be met")
    assert stuck["status"] == "pending"
    assert stuck["reason"] == (
        f"dependency {project}/{first} cancelled; it can never succeed "
        "(cancel or delete this workload)"
    )


def test_dependencies_must_exist_and_be_readable(api: Api) -> None:
    mine, theirs = api.queue()["name"], api.queue()["name"]
    member = _users(api, mine)
    secret = api.submit(theirs, unique("nowhere"), gpu=1)["name"]
    ghost = unique("ghost")
    answers = []
    for target in (secret, ghost):
        response = member["client"].post(
            "/workloads", json={"project": mine, "tasks": [{"gpu": 1}], "after": [target]}
        )
        assert response.status_code == 422, response.text
        answers.append(str(response.json()["detail"]).replace(target, "X"))
        assert names_field(response, "after"), response.text
    # The same answer for another project's workload as for none at all.
    assert answers[0] == answers[1] and "after" in answers[0]
    for bad in (["Bad Name"], ["x:maybe"], [""]):
        response = api.admin.post(
            "/workloads", json={"project": mine, "tasks": [{"gpu": 1}], "after": bad}
        )
        assert names_field(response, "after"), response.text
    assert api.admin.get("/workloads", params={"project": mine}).json() == []


def test_estimated_starts(api: Api) -> None:
    pool = unique("pool")
    project = api.queue()["name"]
    api.node(pool, gpus=4)
    hour = api.submit(project, pool, gpu=2, max_runtime="1h")["name"]
    open_ended = api.submit(project, pool, gpu=2)["name"]
    started = api.wait_status(hour, "running")["started_at"]
    api.wait_status(open_ended, "running")
    after_hour = api.submit(project, pool, gpu=2)["name"]
    # The whole pool: it needs the GPUs of work without a max runtime (a gang larger than
    # the pool is refused at submit).
    never = api.submit(project, pool, gpu=4)["name"]
    api.wait_considered(after_hour)
    api.wait_considered(never)
    listed = api.admin.get("/starts", params={"project": project}).json()
    starts = {start["workload"]: start for start in listed}
    assert set(starts) == {after_hour, never}
    assert abs(starts[after_hour]["estimated_start"] - (started + 3600)) < 1e-3
    assert starts[never]["estimated_start"] is None
    assert "unknown" in starts[never]["why"]


def test_a_change_after_which_the_workload_could_never_run_is_refused(api: Api) -> None:
    """PATCH sees the never-fits check of submit: a node selector that leaves only nodes
    too small for its tasks is 422 with submit's reason, and nothing changes."""
    project = api.queue()["name"]
    big, small = unique("pool"), unique("pool")
    api.node(big, gpus=2)
    api.node(small, gpus=1)
    holder = api.submit(project, big, gpu=2, preemptible=False)["name"]
    api.wait_status(holder, "running")
    waiting = api.submit(project, big, gpu=2)["name"]
    api.wait_considered(waiting)
    refused = api.admin.patch(f"/workloads/{waiting}", json={"node_selector": {"pool": small}})
    assert refused.status_code == 422, refused.text
    assert "has 2 GPUs; the largest has 1" in refused.text, refused.text
    assert api.workload(waiting)["node_selector"] == {"pool": [big]}
    accepted = api.admin.patch(f"/workloads/{waiting}", json={"node_selector": {"pool": big}})
    assert accepted.status_code == 200, accepted.text
