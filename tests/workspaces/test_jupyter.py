"""A real Jupyter Server started as a workspace, reached through the proxy: its API, a
kernel that runs 1+1 over a WebSocket, and that WebSocket's end when its token is revoked."""

from __future__ import annotations

import json
import time
import uuid

from websockets.sync.client import connect
from ws_support import Server

from session_support import ACCESS_ENDED, ended_after


def test_the_api_answers_through_the_proxy(corral: Server, notebook: str) -> None:
    for who in ("admin", "alice"):
        with corral.http(who) as http:
            answer = http.get(f"/w/team-a/{notebook}/api/status")
            assert answer.status_code == 200, answer.text
            assert "kernels" in answer.json()


def test_a_kernel_runs_one_plus_one_over_the_websocket(corral: Server, notebook: str) -> None:
    with corral.http("alice") as http:
        answer = http.post(f"/w/team-a/{notebook}/api/kernels", json={"name": "python3"})
        assert answer.status_code == 201, answer.text
        kernel = answer.json()["id"]
    url = (
        corral.url.replace("http://", "ws://")
        + f"/w/team-a/{notebook}/api/kernels/{kernel}/channels"
    )
    message_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": message_id,
            "username": "test",
            "session": uuid.uuid4().hex,
            "msg_type": "execute_request",
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "content": {"code": "1+1", "silent": False},
        "channel": "shell",
    }
    result = None
    with connect(
        url, additional_headers={"Authorization": f"Bearer {corral.tokens['alice']}"}
    ) as ws:
        ws.send(json.dumps(request))
        for _ in range(200):
            message = json.loads(ws.recv(timeout=60))
            if message.get("parent_header", {}).get("msg_id") != message_id:
                continue
            if message["msg_type"] == "execute_result":
                result = message["content"]["data"]["text/plain"]
                break
            if message["msg_type"] == "error":
                raise AssertionError(message["content"])
    assert result == "2"
    with corral.http("alice") as http:
        assert http.delete(f"/w/team-a/{notebook}/api/kernels/{kernel}").status_code == 204
    # Writes through the proxy are audited, with who made them.
    with corral.api() as api:
        records = api.get("/audit").json()
    made = [
        (r["method"], r["user"], r["status"])
        for r in records
        if r["path"] == f"/w/team-a/{notebook}/api/kernels"
    ]
    assert ("POST", "alice", 201) in made


def test_a_revoked_token_ends_a_kernels_websocket_within_5_s(corral: Server, notebook: str) -> None:
    """A WebSocket through the proxy (a kernel's channels: code that runs as the
    workspace's account) ends once its token is revoked, as exec sessions do."""
    with corral.api() as api:
        made = api.post("/users/alice/tokens", json={"name": "kernel"}).json()
    with corral.http("alice") as http:
        answer = http.post(f"/w/team-a/{notebook}/api/kernels", json={"name": "python3"})
        assert answer.status_code == 201, answer.text
        kernel = answer.json()["id"]
    url = (
        corral.url.replace("http://", "ws://")
        + f"/w/team-a/{notebook}/api/kernels/{kernel}/channels"
    )
    try:
        with connect(url, additional_headers={"Authorization": f"Bearer {made['token']}"}) as ws:
            with corral.api() as api:
                assert api.delete(f"/tokens/{made['id']}").status_code == 204
            took, code, reason = ended_after(ws, time.monotonic())
            assert took < 5 and code == ACCESS_ENDED, (took, code)
            assert reason == "session ended: the token is not valid"
    finally:
        with corral.http("alice") as http:
            assert http.delete(f"/w/team-a/{notebook}/api/kernels/{kernel}").status_code == 204
