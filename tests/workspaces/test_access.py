"""Who gets in, and what bad input gets: only the workload's owner, its project's
project-admins and admins reach its URLs, exec, shell and port-forward; everyone else
(a teammate, a viewer, another project's member, nobody), and every request for
something that is not there, gets a clear 4xx and starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from ws_support import Server


def refused_socket(corral: Server, path: str, who: str | None) -> int:
    """The HTTP status a WebSocket to `path` is refused with, as `who`."""
    headers = {"Authorization": f"Bearer {corral.tokens[who]}"} if who else {}
    with pytest.raises(InvalidStatus) as refused:
        connect(corral.ws_url(path), additional_headers=headers, open_timeout=10).close()
    status: int = refused.value.response.status_code
    return status


def exec_path(name: str, *command: str) -> str:
    query = "&".join(f"command={part}" for part in command)
    return f"/api/v1/workloads/{name}/exec?{query}"


def test_an_outsider_is_refused_at_every_entry(
    corral: Server, notebook: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    for who, status in (("mia", 403), ("bob", 404), ("vera", 403), (None, 401)):
        with corral.http(who) as http:
            for path in (
                f"/w/team-a/{notebook}/",
                f"/w/team-a/{notebook}/api/status",
                f"/w/team-a/{notebook}/api",
            ):
                answer = http.get(path)
                assert answer.status_code == status, (who, path, answer.text)
                assert "detail" in answer.json()
            assert http.post(f"/w/team-a/{notebook}/api/kernels", json={}).status_code == status
        kernels = f"/w/team-a/{notebook}/api/kernels/x/channels"
        assert refused_socket(corral, kernels, who) == status
        assert refused_socket(corral, exec_path(notebook, "touch", str(marker)), who) == status
        forward = f"/api/v1/workloads/{notebook}/ports/main/forward"
        assert refused_socket(corral, forward, who) == status
    assert not marker.exists()
    # A teammate is told why: the workspace is the admin's, and runs as the admin's account.
    with corral.http("mia") as http:
        detail = http.get(f"/w/team-a/{notebook}/").json()["detail"]
    assert detail.startswith(
        f"team-a/{notebook} is admin's: only admin, the project-admins of team-a"
    )
    # The CLI says so, and runs nothing.
    done = corral.cli("exec", notebook, "--", "touch", str(marker), who="bob")
    assert done.returncode != 0 and "404" in done.stderr and "not found" in done.stderr
    done = corral.cli("shell", notebook, who="bob")
    assert done.returncode != 0 and "not found" in done.stderr
    done = corral.cli("port-forward", notebook, "0:main", who="bob")
    assert done.returncode != 0 and "not found" in done.stderr
    assert not marker.exists()


def test_a_token_in_the_url_alone_gets_nowhere(corral: Server, notebook: str) -> None:
    with corral.http(None) as http:
        answer = http.get(
            f"/w/team-a/{notebook}/api/status", params={"token": corral.tokens["admin"]}
        )
        assert answer.status_code == 401
        page = http.get(f"/w/team-a/{notebook}/tree", headers={"Accept": "text/html"})
        assert page.status_code == 303
        assert page.headers["location"].startswith("/login?next=")


def test_a_cross_site_request_with_the_cookie_is_refused(corral: Server, notebook: str) -> None:
    with corral.http(None) as http:
        http.cookies.set("corral_token", corral.tokens["alice"])
        assert http.get(f"/w/team-a/{notebook}/api/status").status_code == 200
        answer = http.post(
            f"/w/team-a/{notebook}/api/kernels", json={}, headers={"Origin": "http://evil.example"}
        )
        assert answer.status_code == 403


def test_the_workload_never_sees_the_users_token(corral: Server, tmp_path: Path) -> None:
    """A web app that echoes its request headers: no Authorization, no corral cookie."""
    script = (
        "import http.server, json, os, threading\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = json.dumps({'path': self.path, 'headers': dict(self.headers),\n"
        "                           'port': self.server.server_address[1]}).encode()\n"
        "        self.send_response(200)\n"
        "        self.send_header('Content-Type', 'application/json')\n"
        "        self.send_header('Set-Cookie', 'corral_token=stolen; Path=/')\n"
        "        self.send_header('Set-Cookie', 'app=1; Path=/')\n"
        "        self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "host = os.environ['CORRAL_HOST']\n"
        "extra = http.server.HTTPServer((host, int(os.environ['CORRAL_PORT_EXTRA'])), H)\n"
        "threading.Thread(target=extra.serve_forever, daemon=True).start()\n"
        "http.server.HTTPServer((host, int(os.environ['CORRAL_PORT'])), H).serve_forever()\n"
    )
    import sys

    done = corral.cli(
        "workspace",
        "create",
        "echo",
        "-p",
        "team-a",
        "--port",
        "main",
        "--port",
        "extra",
        "--",
        sys.executable,
        "-c",
        script,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with corral.http("alice") as http:
        http.cookies.set("corral_token", corral.tokens["alice"])
        http.cookies.set("theirs", "kept")
        answer = http.get("/w/team-a/echo/some/path?q=1")
        assert answer.status_code == 200, answer.text
        seen = answer.json()
        assert seen["path"] == "/some/path?q=1"
        # An encoded "/" stays encoded.
        assert http.get("/w/team-a/echo/a%2Fb%20c").json()["path"] == "/a%2Fb%20c"
        # The other declared port has its own path, without its prefix either.
        other = http.get("/w/team-a/echo/extra/x").json()
        assert other["path"] == "/x" and other["port"] != seen["port"]
        headers = {key.lower(): value for key, value in seen["headers"].items()}
        assert "authorization" not in headers
        assert headers.get("cookie") == "theirs=kept"
        assert corral.tokens["alice"] not in answer.text
        cookies = answer.headers.get_list("set-cookie")
        assert cookies == ["app=1; Path=/"]
    with corral.api() as api:
        assert api.delete("/workloads/echo").status_code == 204


def test_bad_input_is_a_clear_4xx(corral: Server, notebook: str) -> None:
    with corral.http("admin") as http:
        unknown = http.get("/w/no-such-workload/")
        assert unknown.status_code == 404 and "not found" in unknown.json()["detail"]
    assert refused_socket(corral, exec_path("no-such-workload", "true"), "admin") == 404
    # A port it did not declare.
    assert (
        refused_socket(corral, f"/api/v1/workloads/{notebook}/ports/nope/forward", "admin") == 404
    )
    # No command, a bad task, a task it does not have.
    assert refused_socket(corral, f"/api/v1/workloads/{notebook}/exec", "admin") == 422
    assert refused_socket(corral, exec_path(notebook, "true") + "&task=x", "admin") == 422
    assert refused_socket(corral, exec_path(notebook, "true") + "&task=3", "admin") == 404
    # A program that does not exist starts nothing and says why.
    assert refused_socket(corral, exec_path(notebook, "/no/such/program"), "admin") == 400
    # A workspace that is not running: pending, for want of GPUs.
    with corral.api("alice") as api:
        body = {
            "name": "waiting",
            "project": "team-a",
            "tasks": [{"gpu": 2}],
            "priority": "build",
            "command": ["sleep", "600"],
            "ports": [{"name": "main"}],
        }
        created = api.post("/workloads", json=body)
        assert created.status_code == 201, created.text
        bad = api.post("/workloads", json={**body, "name": "twice", "ports": [{"name": "a"}] * 2})
        assert bad.status_code == 422 and "port names must differ" in bad.text
        upper = api.post("/workloads", json={**body, "name": "upper", "ports": [{"name": "A"}]})
        assert upper.status_code == 422 and "ports" in upper.text
    with corral.http("alice") as http:
        waiting = http.get("/w/team-a/waiting/")
        assert waiting.status_code == 409 and "pending" in waiting.json()["detail"]
    assert refused_socket(corral, exec_path("waiting", "true"), "alice") == 409
    with corral.api() as api:
        assert api.delete("/workloads/waiting").status_code == 204
