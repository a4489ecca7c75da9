"""Values the kernel cannot take, and values of the wrong JSON type, are refused at the API
with 422 naming the field, before anything is stored; nothing is coerced."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from server_support import Api, names_field, unique


def post(api: Api, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST `body` as JSON written as json.dumps writes it, with \\u escapes: httpx's own
    encoder cannot encode a lone surrogate at all (a client in another language can)."""
    headers = {"content-type": "application/json"}
    return api.admin.post(path, content=json.dumps(body).encode(), headers=headers)


def workload(project: str, **fields: Any) -> dict[str, Any]:
    return {"project": project, "tasks": [{"gpu": 0}], "command": ["true"], **fields}


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"command": ["sleep", "1\x00; rm -rf /"]}, ("command", 1)),
        ({"command": ["\x00"]}, ("command", 0)),
        ({"command": [""]}, ("command",)),
        # (A lower-case name: error paths drop capitalised parts, taken for type tags.)
        ({"env": {"k": "x\x00y"}}, ("env", "k")),
        ({"env": {"A=B": "x"}}, ("env",)),
        ({"env": {"A\x00": "x"}}, ("env",)),
        ({"env": {"": "x"}}, ("env",)),
        ({"workdir": "/tmp\x00/x"}, ("workdir",)),
        # Half of a UTF-16 pair: valid JSON, but no character to store or run.
        ({"command": ["echo", "\ud800"]}, ("command", 1)),
        ({"env": {"k": "x\udfff"}}, ("env", "k")),
        ({"node_selector": {"rack": "a\x00b"}}, ("node_selector", "rack")),
        ({"node_selector": {"rack": ["r1", "\udc00"]}}, ("node_selector", "rack", 1)),
        # A number of 400 digits is refused before any arithmetic on it.
        ({"tasks": [{"gpu": 0, "memory": "9" * 400}]}, ("tasks", 0, "memory")),
        ({"tasks": [{"gpu": 0, "memory": "9" * 400 + "GiB"}]}, ("tasks", 0, "memory")),
        ({"grace_period": False}, ("grace_period",)),
        ({"grace_period": True}, ("grace_period",)),
        ({"backoff_limit": True}, ("backoff_limit",)),
        ({"backoff_limit": "2"}, ("backoff_limit",)),
        ({"preemptible": 0}, ("preemptible",)),
        ({"preemptible": "false"}, ("preemptible",)),
        ({"tasks": [{"gpu": True}]}, ("tasks", 0, "gpu")),
        ({"tasks": [{"gpu": 0, "replicas": "2"}]}, ("tasks", 0, "replicas")),
    ],
)
def test_a_bad_workload_is_refused_naming_its_field(
    api: Api, fields: dict[str, Any], path: tuple[Any, ...]
) -> None:
    project = api.queue()["name"]
    name = unique("bad")
    response = post(api, "/workloads", {"name": name, **workload(project, **fields)})
    assert response.status_code == 422, response.text
    assert names_field(response, *path), response.text
    # The same format as every other 422: a list of {loc, msg, type}.
    for entry in response.json()["detail"]:
        assert set(entry) == {"loc", "msg", "type"}, entry
    assert api.admin.get(f"/workloads/{name}").status_code == 404
    # In a batch, the bad one is named by its place and nothing is stored.
    batch = post(
        api, "/workloads/batch", {"workloads": [workload(project), workload(project, **fields)]}
    )
    assert batch.status_code == 422, batch.text
    assert names_field(batch, "workloads", 1, *path), batch.text
    assert not [w for w in api.admin.get("/workloads").json() if w["project"] == project]


def test_a_nul_byte_in_a_message_is_named_in_words(api: Api) -> None:
    project = api.queue()["name"]
    response = api.admin.post("/workloads", json=workload(project, env={"K": "a\x00"}))
    assert response.status_code == 422
    assert any("NUL" in entry["msg"] for entry in response.json()["detail"]), response.text


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"virtual": 0}, ("virtual",)),
        ({"virtual": "true"}, ("virtual",)),
        ({"gpus": 2.0}, ("gpus",)),
        ({"gpus": "2"}, ("gpus",)),
        (
            {"devices": [{"index": 0, "uuid": "u", "model": "m", "memory": 1, "virtual": 1}]},
            ("devices", 0, "virtual"),
        ),
    ],
)
def test_node_fields_are_not_coerced(api: Api, body: dict[str, Any], path: tuple[Any, ...]) -> None:
    response = api.admin.post("/nodes", json={"name": unique("n"), **body})
    assert response.status_code == 422, response.text
    assert names_field(response, *path), response.text


@pytest.mark.parametrize("label", ["r\x00", "\ud800r", "\udfff"])
def test_a_label_without_a_character_is_refused(api: Api, label: str) -> None:
    name = unique("n")
    response = post(api, "/nodes", {"name": name, "gpus": 1, "labels": {"rack": label}})
    assert response.status_code == 422, response.text
    assert names_field(response, "labels", "rack"), response.text
    assert api.admin.get(f"/nodes/{name}").status_code == 404


def test_what_was_accepted_before_still_is(api: Api) -> None:
    # Integers where numbers are expected, strings for durations and memory, a map or a
    # number for quotas: strictness refuses wrong types, not these.
    queue = api.queue(deserved={"gpu": 2, "memory": "64GiB"}, over_quota_weight=2)
    node = api.admin.post(
        "/nodes",
        json={"name": unique("n"), "gpus": 2, "cpu": 8, "memory": 1 << 30, "virtual": True},
    )
    assert node.status_code == 201, node.text
    body = workload(
        queue["name"],
        grace_period=0,
        max_runtime="4h",
        env={"PATH": "/bin", "EMPTY": "", "SMILE": "\U0001f600"},
        workdir="relative/dir",
        preemptible=True,
    )
    response = api.admin.post("/workloads", json=body)
    assert response.status_code == 201, response.text
    again = api.admin.post("/workloads", json=workload(queue["name"], grace_period="90s"))
    assert again.status_code == 201, again.text
    assert again.json()["grace_period"] == 90.0


def test_a_unix_user_must_be_a_login_name_and_never_root(api: Api) -> None:
    for bad in ("root", "Alice", "a b", "x" * 33, "a\x00", "-x"):
        response = api.admin.post(
            "/users", json={"name": unique("u"), "role": "viewer", "unix_user": bad}
        )
        assert response.status_code == 422, (bad, response.text)
        assert names_field(response, "unix_user"), response.text
    good = api.admin.post(
        "/users", json={"name": unique("u"), "role": "viewer", "unix_user": "svc_train"}
    )
    assert good.status_code == 201, good.text
