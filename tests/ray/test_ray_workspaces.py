"""Workspaces on a worker node of a real Ray cluster (127.0.0.2), reached through the
server (127.0.0.1): the proxy's HTTP and WebSocket, `exec`, `shell` through a PTY,
port-forward, an outsider refused at every entry, sessions audited and ended when their
token is revoked, and stopping the workload closing every session. One Ray cluster (a
head and one worker) for the whole module."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from livecorral import CORRAL, PYTHON, free_port, runs, wait_until
from raycorral import RayServer, require_ray
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from pty_support import Terminal
from session_support import ACCESS_ENDED, ended_after
from walls_support import knock, nft_table, walled

require_ray()

RAY_WORKERS = (("a", "r1"),)
WORKER_ADDRESS = "127.0.0.2"

# The workspace: http.server on `main`, a WebSocket echo on `ws`, both on CORRAL_HOST.
SERVE = r"""
import asyncio, http.server, os, threading
from websockets.asyncio.server import serve
host = os.environ["CORRAL_HOST"]
web = http.server.ThreadingHTTPServer(
    (host, int(os.environ["CORRAL_PORT"])), http.server.SimpleHTTPRequestHandler
)
threading.Thread(target=web.serve_forever, daemon=True).start()
async def echo(ws):
    async for message in ws:
        await ws.send(message)
async def main():
    async with serve(echo, host, int(os.environ["CORRAL_PORT_WS"])):
        await asyncio.Future()
asyncio.run(main())
"""


@dataclass
class Site:
    """The module's server with projects team-a and team-b, alice (team-a's
    project-admin, who enters the admin's workspaces there) and bob (a member of team-b),
    and the CLI as each of them."""

    server: RayServer
    tokens: dict[str, str] = field(default_factory=dict)

    def env(self, who: str) -> dict[str, str]:
        home = self.server.data_dir / f"home-{who}"
        home.mkdir(exist_ok=True)
        return {
            **os.environ,
            "HOME": str(home),
            "CORRAL_SERVER": self.server.url,
            "CORRAL_TOKEN": self.tokens[who],
        }

    def cli(
        self, *args: str, who: str = "alice", stdin: str = ""
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CORRAL, *args],
            env=self.env(who),
            capture_output=True,
            text=True,
            timeout=180,
            input=stdin,
        )

    def http(self, who: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=30)

    def ws(self, path: str, who: str = "alice") -> ClientConnection:
        url = self.server.url.replace("http://", "ws://") + path
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return connect(url, additional_headers=headers, open_timeout=30, proxy=None)

    def create(self, name: str) -> None:
        """The workspace, made by the admin in team-a (its tasks run as the admin's
        account: alice's, nobody, could not run this Python)."""
        done = self.cli(
            "workspace", "create", name, "-p", "team-a", "-g", "0.5",
            "--port", "main", "--port", "ws", "--", PYTHON, "-c", SERVE,
            who="admin",
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"/w/team-a/{name}/" in done.stdout, done.stdout


@pytest.fixture(scope="module")
def site(ray_server: RayServer) -> Site:
    found = Site(ray_server, {"admin": ray_server.token})
    for project in ("team-a", "team-b"):
        ray_server.queue(project, 1)
    for name, project in (("alice", "team-a"), ("bob", "team-b")):
        body = {"name": name, "role": "member", "project": project, "unix_user": "nobody"}
        found.tokens[name] = ray_server.post("/users", body)["token"]
    with ray_server.client() as admin:
        answer = admin.put("/users/alice/projects/team-a", json={"role": "project-admin"})
        assert answer.status_code == 200, answer.text
    return found


@pytest.fixture(scope="module")
def web(site: Site) -> str:
    site.create("web")
    return "web"


def test_a_workspace_on_a_worker_node_through_the_proxy(site: Site, web: str) -> None:
    node = site.server.nodes()[site.server.get(f"/workspaces/{web}")["node"]]
    assert node["name"] == "a" and node["address"] == WORKER_ADDRESS, node
    with site.http("alice") as http:
        listing = http.get("/w/team-a/web/")
        assert listing.status_code == 200 and "Directory listing" in listing.text
    with site.ws("/w/team-a/web/ws/") as ws:
        ws.send("ping over ray")
        assert ws.recv(timeout=30) == "ping over ray"
        ws.send(b"\x00\x01binary")
        assert ws.recv(timeout=30) == b"\x00\x01binary"
    # Outsiders: another project's member sees no such workload; nobody without a token.
    with site.http("bob") as http:
        assert http.get("/w/team-a/web/").status_code == 404
    with site.http(None) as http:
        assert http.get("/w/team-a/web/").status_code == 401


def test_exec_gives_output_and_exit_code_on_the_node(site: Site, web: str) -> None:
    done = site.cli(
        "exec", "web", "--", "/bin/sh", "-c", 'echo "on $CORRAL_HOST"; echo err >&2; exit 3'
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == f"on {WORKER_ADDRESS}\n" and done.stderr == "err\n"
    # Standard input reaches it, and its end too; large output comes back whole.
    done = site.cli("exec", "web", "--", "/bin/cat", stdin="hello\nworld\n")
    assert (done.returncode, done.stdout) == (0, "hello\nworld\n"), done.stderr
    done = site.cli("exec", "web", "--", PYTHON, "-c", "print('x' * 3_000_000)")
    assert done.returncode == 0 and done.stdout == "x" * 3_000_000 + "\n"
    # Refusals, as on one machine: a command that cannot start, an outsider.
    done = site.cli("exec", "web", "--", "/no/such/program")
    assert done.returncode != 0 and "400" in done.stderr and "cannot start" in done.stderr
    done = site.cli("exec", "web", "--", "/bin/true", who="bob")
    assert done.returncode != 0 and "404" in done.stderr, done.stderr
    done = site.cli("port-forward", "web", f"{free_port()}:main", who="bob")
    assert done.returncode != 0 and "404" in done.stderr, done.stderr


def test_shell_is_driven_through_a_pty(site: Site, web: str) -> None:
    argv = [CORRAL, "shell", "web", "--shell", "/bin/sh"]
    with Terminal(argv, site.env("alice")) as terminal:
        # The workspace's account: root's prompt when the tests run as root.
        terminal.read_until(b"# " if os.geteuid() == 0 else b"$ ")
        terminal.type(b"echo product=$((6*7)) on $CORRAL_HOST; tty\n")
        terminal.read_until(f"product=42 on {WORKER_ADDRESS}".encode())
        terminal.read_until(b"/dev/pts/")
        terminal.type(b"exit 5\n")
        assert terminal.exit_code() == 5


@contextlib.contextmanager
def forwarding(site: Site, spec: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`corral port-forward web SPEC` as alice, and the local port it printed."""
    forward = subprocess.Popen(
        [CORRAL, "port-forward", "web", spec],
        env=site.env("alice"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert forward.stderr is not None
        line = forward.stderr.readline().decode()
        assert line.startswith("Forwarding 127.0.0.1:"), line
        yield forward, int(line.split()[1].rpartition(":")[2])
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_port_forward_carries_an_http_request(site: Site, web: str) -> None:
    """To `main` by name, then by its number on the node, from any free local port."""
    number = site.cli("exec", "web", "--", "/bin/sh", "-c", 'echo "$CORRAL_PORT"').stdout.strip()
    for spec in (f"{free_port()}:main", f":{number}"):
        with forwarding(site, spec) as (forward, local):

            def answer() -> httpx.Response | None:
                assert forward.poll() is None, forward.communicate()
                with contextlib.suppress(httpx.HTTPError):
                    return httpx.get(f"http://127.0.0.1:{local}/", timeout=5, trust_env=False)
                return None

            found = wait_until(answer, 30, "the forwarded port to answer")
            assert found.status_code == 200 and "Directory listing" in found.text


def test_a_relayed_session_is_audited_and_ends_once_its_token_is_revoked(
    site: Site, web: str
) -> None:
    """Through the node's exec relay as on one machine: the command's exit code reaches
    the audit log, and a session ends within 5 s of its token's revocation, saying why,
    its command killed on the node."""
    done = site.cli("exec", "web", "--", "/bin/sh", "-c", "exit 4")
    assert done.returncode == 4, done.stderr
    made = site.server.post("/users/alice/tokens", {"name": "relay"})
    site.tokens["alice-relay"] = made["token"]
    marker = "600.404"
    with site.ws(f"/api/v1/workloads/web/exec?command=sleep&command={marker}", "alice-relay") as ws:
        wait_until(lambda: runs("sleep", marker), 30, "the session's command to start")
        with site.server.client() as admin:
            assert admin.delete(f"/tokens/{made['id']}").status_code == 204
        took, code, reason = ended_after(ws, time.monotonic())
        assert took < 5 and code == ACCESS_ENDED, (took, code)
        assert reason == "session ended: the token is not valid"
    wait_until(lambda: not runs("sleep", marker), 5, "the session's command to be killed")
    records = site.server.get("/audit", action="EXEC")
    [exited] = [r for r in records if r["command"] == ["/bin/sh", "-c", "exit 4"]]
    assert (exited["user"], exited["workload"], exited["exit_code"]) == ("alice", "team-a/web", 4)
    [ended] = [r for r in records if r["command"] == ["sleep", marker]]
    assert ended["ended_at"] is not None and ended["exit_code"] is None, ended


def test_stopping_the_workload_closes_every_session(site: Site) -> None:
    site.create("victim")
    with contextlib.ExitStack() as stack:
        sleeper = stack.enter_context(
            site.ws("/api/v1/workloads/victim/exec?command=sleep&command=600")
        )
        shell = stack.enter_context(
            site.ws("/api/v1/workloads/victim/exec?command=/bin/sh&tty=true")
        )
        forward = stack.enter_context(site.ws("/api/v1/workloads/victim/ports/main/forward"))
        echo = stack.enter_context(site.ws("/w/team-a/victim/ws/"))
        forward.send(b"GET / HTTP/1.0\r\n\r\n")
        assert b"200" in forward.recv(timeout=30)
        shell.send(b"echo ready\n")
        seen = b""
        while b"ready\r\n" not in seen:
            message = shell.recv(timeout=30)
            assert isinstance(message, bytes)
            seen += message[1:]
        done = site.cli("workspace", "stop", "victim", who="admin")
        assert done.returncode == 0, done.stderr
        for ws in (sleeper, shell, forward, echo):
            ended = []
            try:
                while True:
                    ended.append(ws.recv(timeout=30))
            except ConnectionClosed:
                pass
            texts = [m for m in ended if isinstance(m, str)]
            if ws in (sleeper, shell):
                assert texts and json.loads(texts[-1])["exit"] == 137, ended
    site.server.wait_status("victim", "suspended")


def test_the_workspace_ports_answer_only_corral_and_their_account(site: Site, web: str) -> None:
    """The node's agent walls the workspace's two ports and lets the server's host in:
    another account's process on the machine is refused at the node's address (the
    proxy, as above, gets through)."""
    from corral.agent import portwall

    if os.geteuid() != 0 or portwall.available() is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must wall ports: {portwall.available()}")
        pytest.skip("ports cannot be walled here")
    agent = site.server.agent_dir / "a"
    ports = walled(agent, site.server.get(f"/workloads/{web}")["directory"])
    assert len(ports) == 2, nft_table(agent)
    servers = [
        item["set"] for item in nft_table(agent) if item.get("set", {}).get("name") == "servers4"
    ]
    assert servers and servers[0].get("elem") == ["127.0.0.1"], servers
    for port in ports:
        assert knock(WORKER_ADDRESS, port, "nobody").startswith("refused"), port
        assert knock(WORKER_ADDRESS, port) == "open", port
