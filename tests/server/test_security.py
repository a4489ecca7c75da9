"""Tokens (expiry, revocation, names, last use), the audit log of writes, Idempotency-Key
on submissions, rate limits on writes, OPTIONS, and the first admin token on a terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import Api, unique, wait_for

CORRAL = str(Path(sys.executable).with_name("corral"))


def _member(api: Api, project: str) -> tuple[str, str]:
    name = unique("member")
    response = api.admin.post("/users", json={"name": name, "role": "member", "project": project})
    assert response.status_code == 201, response.text
    return name, response.json()["token"]


def _token(api: Api, user: str, **body: Any) -> dict[str, Any]:
    response = api.admin.post(f"/users/{user}/tokens", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _tokens(api: Api, user: str) -> list[dict[str, Any]]:
    response = api.admin.get("/tokens", params={"user": user})
    assert response.status_code == 200, response.text
    return list(response.json())


def _body(project: str, pool: str) -> dict[str, Any]:
    return {"project": project, "tasks": [{"gpu": 1}], "node_selector": {"pool": pool}}


# -- tokens --------------------------------------------------------------------------------


def test_revoked_and_expired_tokens_are_refused_at_once(api: Api) -> None:
    project = api.queue("tok")["name"]
    user, first = _member(api, project)
    # Long enough to be used once on a loaded machine, short enough to wait for.
    second = _token(api, user, name="ci", expires_in=6)
    assert second["name"] == "ci" and second["expires_at"] > time.time()
    with api.client(first) as one, api.client(second["token"]) as two:
        # Both work, and are now in the server's 10 s token cache.
        assert one.get("/whoami").json()["name"] == user
        assert two.get("/whoami").json()["name"] == user
        listed = {t["name"]: t for t in _tokens(api, user)}
        response = api.admin.delete(f"/tokens/{listed[None]['id']}")
        assert response.status_code == 204, response.text
        # Revoked: refused on the very next request, not after the cache's 10 s.
        assert one.get("/whoami").status_code == 401
        # Expired: refused as soon as its time is up, though it is cached.
        wait_for(lambda: two.get("/whoami").status_code == 401, "the token to expire", 15)
    states = {t["name"]: t for t in _tokens(api, user)}
    assert states[None]["revoked_at"] is not None and not states[None]["active"]
    assert states["ci"]["revoked_at"] is None and not states["ci"]["active"]
    # Revoking a token that does not exist, or an invalid expiry, is refused.
    assert api.admin.delete("/tokens/999999").status_code == 404
    # An id past 64 bits is the request's fault, not a server error (found by the fuzzer).
    huge = api.admin.delete(f"/tokens/{2**70}")
    assert huge.status_code == 422 and "token_id" in huge.text, huge.text
    bad = api.admin.post(f"/users/{user}/tokens", json={"expires_in": "soon"})
    assert bad.status_code == 422, bad.text


def test_token_list_shows_names_and_last_use_never_values(api: Api) -> None:
    project = api.queue("tok")["name"]
    user, first = _member(api, project)
    named = _token(api, user, name="laptop")
    before = {t["id"]: t for t in _tokens(api, user)}
    assert before[named["id"]]["last_used_at"] is None
    started = time.time()
    with api.client(named["token"]) as client:
        assert client.get("/whoami").status_code == 200
    after = {t["id"]: t for t in _tokens(api, user)}
    assert after[named["id"]]["last_used_at"] >= started - 1
    assert after[named["id"]]["name"] == "laptop"
    text = api.admin.get("/tokens").text
    assert named["token"] not in text and first not in text
    assert "digest" not in text
    # A member lists their own tokens only, and cannot revoke another's.
    with api.client(first) as member:
        mine = member.get("/tokens").json()
        assert {t["user"] for t in mine} == {user}
        assert member.get("/tokens", params={"user": "admin"}).status_code == 403
        admin_token = _tokens(api, "admin")[0]["id"]
        assert member.delete(f"/tokens/{admin_token}").status_code == 404


def test_deleting_a_user_revokes_their_tokens_at_once(api: Api) -> None:
    project = api.queue("del")["name"]
    user, token = _member(api, project)
    with api.client(token) as client:
        assert client.get("/whoami").status_code == 200
        response = api.admin.delete(f"/users/{user}")
        assert response.status_code == 204, response.text
        assert client.get("/whoami").status_code == 401
    assert user not in {u["name"] for u in api.admin.get("/users").json()}
    assert api.admin.delete(f"/users/{user}").status_code == 404
    assert api.admin.delete("/users/admin").status_code == 409


# -- audit ---------------------------------------------------------------------------------


def _audit(api: Api, **params: Any) -> list[dict[str, Any]]:
    response = api.admin.get("/audit", params=params)
    assert response.status_code == 200, response.text
    return list(response.json())


def test_every_write_is_audited_with_its_outcome_and_reads_are_not(api: Api) -> None:
    project, pool = api.queue("aud")["name"], unique("pool")
    user, token = _member(api, project)
    other = api.queue("aud")["name"]
    started = time.time()
    with api.client(token) as client:
        ok = client.post("/workloads", json=_body(project, pool))
        assert ok.status_code == 201
        assert client.post("/workloads", json=_body(other, pool)).status_code == 403
        invalid = client.post("/workloads", json={**_body(project, pool), "tasks": []})
        assert invalid.status_code == 422
        assert client.get("/workloads").status_code == 200
        assert client.get(f"/workloads/{ok.json()['name']}").status_code == 200
        assert client.delete(f"/workloads/{ok.json()['name']}").status_code == 204
    with api.client("crl_not-a-token") as stranger:
        assert stranger.post("/queues", json={"name": unique("q")}).status_code == 401

    records = _audit(api, user=user, since=started - 1)
    got = [(r["method"], r["route"], r["status"]) for r in records]
    assert got == [
        ("POST", "/api/v1/workloads", 201),
        ("POST", "/api/v1/workloads", 403),
        ("POST", "/api/v1/workloads", 422),
        ("DELETE", "/api/v1/workloads/{name}", 204),
    ]
    for record in records:
        assert record["address"] == "127.0.0.1"
        assert started - 1 <= record["at"] <= time.time()
    assert records[-1]["path"] == f"/api/v1/workloads/{ok.json()['name']}"
    # The request without a valid token is recorded with no user.
    anonymous = _audit(api, action="POST /api/v1/queues", outcome="401", since=started - 1)
    assert anonymous and all(r["user"] is None for r in anonymous)

    # Filters: outcome (exact and by class), action, until; only admins may read.
    assert [r["status"] for r in _audit(api, user=user, outcome="4xx")] == [403, 422]
    assert [r["status"] for r in _audit(api, user=user, outcome="204")] == [204]
    assert len(_audit(api, user=user, action="DELETE")) == 1
    assert _audit(api, user=user, until=started - 1) == []
    assert api.admin.get("/audit", params={"outcome": "ok"}).status_code == 422
    with api.client(token) as client:
        assert client.get("/audit").status_code == 403


def test_a_submission_is_audited_once_with_the_answer_it_got(api: Api) -> None:
    # A submission's record is committed with its workload; a refused one (a name taken,
    # a retried Idempotency-Key) is recorded by the middleware instead: once each.
    project, pool = api.queue("aud")["name"], unique("pool")
    user, token = _member(api, project)
    name = unique("job")
    started = time.time()
    with api.client(token) as client:
        assert (
            client.post("/workloads", json={**_body(project, pool), "name": name}).status_code
            == 201
        )
        clash = client.post("/workloads", json={**_body(project, pool), "name": name})
        assert clash.status_code == 409
        key = {"Idempotency-Key": unique("key")}
        first = client.post("/workloads", json=_body(project, pool), headers=key)
        again = client.post("/workloads", json=_body(project, pool), headers=key)
        assert first.status_code == again.status_code == 201
        assert again.headers["Idempotent-Replayed"] == "true"
    records = _audit(api, user=user, since=started - 1)
    assert [(r["route"], r["status"]) for r in records] == [
        ("/api/v1/workloads", 201),
        ("/api/v1/workloads", 409),
        ("/api/v1/workloads", 201),
        ("/api/v1/workloads", 201),
    ]
    assert all(r["path"] == "/api/v1/workloads" and r["address"] for r in records)
    assert all(started - 1 <= r["at"] <= time.time() for r in records)


def test_audit_exports_json_lines(api: Api) -> None:
    project = api.queue("exp")["name"]
    user, _ = _member(api, project)
    api.admin.post(f"/users/{user}/tokens", json={"name": "x"})
    api.admin.post(f"/users/{user}/tokens", json={"name": "y"})
    response = api.admin.get("/audit/export", params={"action": "/users/{name}/tokens"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    mine = [r for r in lines if r["path"] == f"/api/v1/users/{user}/tokens"]
    assert [(r["user"], r["status"]) for r in mine] == [("admin", 201), ("admin", 201)]
    write = {"id", "at", "user", "method", "route", "path", "address", "status"}
    session = {"workload", "task", "command", "ended_at", "exit_code"}
    assert set(mine[0]) == write | session
    assert all(mine[0][field] is None for field in session)  # a write is no session


# -- idempotency ---------------------------------------------------------------------------


def test_a_retried_submission_returns_the_first_answer(api: Api) -> None:
    project, pool = api.queue("idem")["name"], unique("pool")
    key = {"Idempotency-Key": unique("key")}
    body = _body(project, pool)
    first = api.admin.post("/workloads", json=body, headers=key)
    again = api.admin.post("/workloads", json=body, headers=key)
    assert first.status_code == again.status_code == 201, again.text
    assert again.json()["name"] == first.json()["name"]
    assert again.headers["idempotent-replayed"] == "true"
    assert len(api.admin.get("/workloads", params={"project": project}).json()) == 1
    # The same key with another body is refused, saying why.
    changed = api.admin.post("/workloads", json={**body, "priority": 5}, headers=key)
    assert changed.status_code == 422, changed.text
    assert "different body" in changed.text
    # Without a key, or with another, a second workload is made.
    assert api.admin.post("/workloads", json=body).status_code == 201
    other = api.admin.post("/workloads", json=body, headers={"Idempotency-Key": unique("k")})
    assert other.status_code == 201
    assert len(api.admin.get("/workloads", params={"project": project}).json()) == 3


def test_concurrent_retries_with_one_key_make_one_workload(api: Api) -> None:
    import concurrent.futures

    project, pool = api.queue("idem")["name"], unique("pool")
    key = {"Idempotency-Key": unique("key")}

    def post(_: int) -> httpx.Response:
        with api.client() as client:
            return client.post("/workloads", json=_body(project, pool), headers=key)

    with concurrent.futures.ThreadPoolExecutor(8) as pool_:
        answers = list(pool_.map(post, range(8)))
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
    assert len({a.json()["name"] for a in answers}) == 1
    assert len(api.admin.get("/workloads", params={"project": project}).json()) == 1


def test_a_retried_batch_returns_the_first_answer(api: Api) -> None:
    project, pool = api.queue("idem")["name"], unique("pool")
    key = {"Idempotency-Key": unique("key")}
    body = {"workloads": [_body(project, pool), _body(project, pool)]}
    first = api.admin.post("/workloads/batch", json=body, headers=key)
    again = api.admin.post("/workloads/batch", json=body, headers=key)
    assert first.status_code == again.status_code == 201, again.text
    assert [w["name"] for w in again.json()] == [w["name"] for w in first.json()]
    assert len(api.admin.get("/workloads", params={"project": project}).json()) == 2
    body["workloads"].append(_body(project, pool))
    assert api.admin.post("/workloads/batch", json=body, headers=key).status_code == 422


@pytest.mark.parametrize("path", ["/workloads", "/workloads/batch"])
def test_idempotent_retry_after_the_server_is_killed(
    live_server: Any, path: str, request: pytest.FixtureRequest
) -> None:
    api = Api(live_server)
    request.addfinalizer(api.close)
    project, pool = api.queue("crash")["name"], unique("pool")
    key = {"Idempotency-Key": unique("key")}
    one = _body(project, pool)
    body = one if path == "/workloads" else {"workloads": [one, one]}
    first = api.admin.post(path, json=body, headers=key)
    assert first.status_code == 201, first.text
    live_server.kill()
    live_server.restart()
    with live_server.client() as client:
        again = client.post(path, json=body, headers=key)
        assert again.status_code == 201, again.text
        names = [w["name"] for w in (first.json() if path != "/workloads" else [first.json()])]
        replayed = again.json() if path != "/workloads" else [again.json()]
        assert [w["name"] for w in replayed] == names
        listed = client.get("/workloads", params={"project": project}).json()
    assert len(listed) == (1 if path == "/workloads" else 2)
    # The write acknowledged before the kill was audited (its answer waited for it).
    with live_server.client() as client:
        actions = client.get("/audit", params={"action": f"POST /api/v1{path}"}).json()
    assert [r["status"] for r in actions] == [201, 201]


# -- rate limits, OPTIONS ------------------------------------------------------------------


def test_writes_over_the_rate_limit_get_429_with_retry_after(
    tmp_path: Path, start_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bucket of 3 writes, refilled by one every 10 s.
    monkeypatch.setenv("CORRAL_WRITE_RATE", "0.1")
    monkeypatch.setenv("CORRAL_WRITE_BURST", "3")
    server = start_server(tmp_path, None)
    api = Api(server)
    try:
        other = _token(api, "admin", name="other")["token"]
        statuses = [
            api.admin.post("/queues", json={"name": unique("q"), "deserved": 1}) for _ in range(4)
        ]
        assert [r.status_code for r in statuses] == [201, 201, 429, 429]
        assert 1 <= int(statuses[-1].headers["retry-after"]) <= 10
        assert "too many writes" in statuses[-1].json()["detail"]
        # Reads are not limited; another token has a bucket of its own.
        assert api.admin.get("/queues").status_code == 200
        with api.client(other) as second:
            assert second.post("/queues", json={"name": unique("q")}).status_code == 201
            refused = second.get("/audit", params={"outcome": "429"}).json()
        assert [(r["user"], r["route"]) for r in refused] == [("admin", "/api/v1/queues")] * 2
    finally:
        api.close()
        server.stop()


def test_options_answers_with_the_allowed_methods(api: Api) -> None:
    with httpx.Client(base_url=api.server.api) as anonymous:
        response = anonymous.options("/workloads/some-name")
        assert response.status_code == 204
        assert response.headers["allow"] == "DELETE, GET, HEAD, OPTIONS, PATCH"
        assert anonymous.options("/workloads").headers["allow"] == "GET, HEAD, OPTIONS, POST"
        assert (
            anonymous.options("/queues/q").headers["allow"] == "DELETE, GET, HEAD, OPTIONS, PATCH"
        )
        assert anonymous.options("/nowhere").status_code == 404
        # A method the path does not have: 405, naming every method it has (each of a
        # path's methods is a route of its own, and Starlette named the first one's).
        for method, path, allow in [
            ("PUT", "/workloads", "GET, HEAD, OPTIONS, POST"),
            ("POST", "/workloads/some-name", "DELETE, GET, HEAD, OPTIONS, PATCH"),
            ("PUT", "/queues/q", "DELETE, GET, HEAD, OPTIONS, PATCH"),
        ]:
            refused = anonymous.request(method, path)
            assert refused.status_code == 405, (method, path)
            assert refused.headers["allow"] == allow, (method, path)


# -- the first admin token -----------------------------------------------------------------


def _first_start(tmp_path: Path, port: int, stdout: int) -> subprocess.Popen[bytes]:
    args = [CORRAL, "server", "--data-dir", str(tmp_path), "--port", str(port)]
    return subprocess.Popen(args, stdout=stdout, stderr=subprocess.STDOUT)


def _read_until(fd: int, needle: bytes, timeout: float = 60) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    return seen


def test_the_first_admin_token_is_printed_only_on_a_terminal(
    tmp_path: Path, root_conftest: Any
) -> None:
    # On a terminal: printed once, and in the file.
    controller, terminal = pty.openpty()
    process = _first_start(tmp_path / "tty", root_conftest.free_port(), terminal)
    os.close(terminal)
    try:
        seen = _read_until(controller, b"crl_")
        seen += _read_until(controller, b"\n", 5)
    finally:
        process.terminate()
        process.wait(timeout=30)
        os.close(controller)
    token = (tmp_path / "tty" / "admin-token").read_text().strip()
    assert token.encode() in seen, seen
    # Into a pipe: only where the token is.
    data = tmp_path / "pipe"
    process = _first_start(data, root_conftest.free_port(), subprocess.PIPE)
    assert process.stdout is not None
    try:
        seen = _read_until(process.stdout.fileno(), b"admin token written to")
        seen += _read_until(process.stdout.fileno(), b"\n", 5)
    finally:
        process.terminate()
        process.wait(timeout=30)
    token = (data / "admin-token").read_text().strip()
    assert b"admin token written to" in seen and token.encode() not in seen
    assert b"crl_" not in seen
