"""exec, shell and port-forward beside a running workspace, and what stopping it does to
every session."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from ws_support import CORRAL, Server, free_port, wait_until

from corral.api.threads import WORKER_THREADS
from pty_support import Terminal

SERVE = 'exec "$0" -m http.server --bind "$CORRAL_HOST" "$CORRAL_PORT"'


def create_web(corral: Server, name: str) -> None:
    """A workspace serving its own directory with python -m http.server."""
    done = corral.cli(
        "workspace",
        "create",
        name,
        "-p",
        "team-a",
        "-g",
        "0.5",
        "--",
        "/bin/sh",
        "-c",
        SERVE,
        sys.executable,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"/w/team-a/{name}/" in done.stdout


@pytest.fixture(scope="module")
def web(corral: Server) -> str:
    """The workspace "web", for every test that uses it (tests of one module may run on
    different pytest-xdist workers, so none may count on another having made it)."""
    create_web(corral, "web")
    return "web"


def test_exec_gives_output_and_exit_code(corral: Server, web: str) -> None:
    done = corral.cli(
        "exec",
        "web",
        "--",
        "/bin/sh",
        "-c",
        'echo "out $CORRAL_WORKLOAD $CORRAL_PORT"; pwd; echo err >&2; exit 3',
    )
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    port = corral.workload("web")["ports"][0]["name"]
    assert port == "main"
    assert lines[0].startswith("out web ") and lines[0].split()[2].isdigit()
    assert lines[1].endswith(f"/{corral.workload('web')['directory']}")  # its own directory
    assert done.stderr == "err\n"
    # Standard input reaches it, and its end too.
    done = corral.cli("exec", "web", "--", "/bin/cat", stdin="hello\nworld\n")
    assert done.returncode == 0 and done.stdout == "hello\nworld\n"
    # The proxy strips /w/team-a/web/ for a program that does not know its prefix.
    with corral.http("alice") as http:
        listing = http.get("/w/team-a/web/")
        assert listing.status_code == 200 and "Directory listing" in listing.text


def test_shell_is_driven_through_a_pty(corral: Server, web: str) -> None:
    argv = [CORRAL, "shell", "web", "--shell", "/bin/sh"]
    with Terminal(argv, corral.cli_env("alice")) as terminal:
        # The prompt first: the CLI flushes what was typed before its terminal went raw.
        terminal.read_until(b"# " if os.geteuid() == 0 else b"$ ")
        terminal.type(b"echo product=$((6*7)); tty\n")
        terminal.read_until(b"product=42")
        terminal.read_until(b"/dev/pts/")
        terminal.type(b"exit 5\n")
        assert terminal.exit_code() == 5


def test_port_forward_carries_an_http_request(corral: Server, web: str) -> None:
    local = free_port()
    with forwarding(corral, f"{local}:main") as forward:
        found = wait_until(lambda: answer(forward, local), 30, "the forwarded port to answer")
        assert found.status_code == 200 and "Directory listing" in found.text


def test_port_forward_by_number_to_any_free_local_port(corral: Server, web: str) -> None:
    """`:REMOTE`, REMOTE the number of a declared port on the node: a free local port,
    printed; a number no declared port has is refused, naming the declared ones."""
    number = corral.cli("exec", "web", "--", "/bin/sh", "-c", 'echo "$CORRAL_PORT"')
    assert number.returncode == 0, number.stderr
    remote = number.stdout.strip()
    with forwarding(corral, f":{remote}") as forward:
        assert forward.stderr is not None
        line = forward.stderr.readline().decode()
        assert line.startswith("Forwarding 127.0.0.1:") and line.endswith(f"-> web:{remote}\n")
        local = int(line.split()[1].rpartition(":")[2])
        assert local > 0
        found = wait_until(lambda: answer(forward, local), 30, "the forwarded port to answer")
        assert found.status_code == 200 and "Directory listing" in found.text
    other = str(int(remote) + 1 if int(remote) < 65535 else int(remote) - 1)
    refused = corral.cli("port-forward", "web", f"{free_port()}:{other}", who="alice")
    assert refused.returncode != 0
    assert f"404: workload team-a/web declares no port on number '{other}'" in refused.stderr
    assert f"(its ports: main on {remote})" in refused.stderr


@contextlib.contextmanager
def forwarding(corral: Server, spec: str) -> Iterator[subprocess.Popen[bytes]]:
    """`corral port-forward web SPEC` as alice, until the block ends."""
    forward = subprocess.Popen(
        [CORRAL, "port-forward", "web", spec],
        env=corral.cli_env("alice"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield forward
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def answer(forward: subprocess.Popen[bytes], local: int) -> httpx.Response | None:
    assert forward.poll() is None, forward.communicate()
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"http://127.0.0.1:{local}/", timeout=5, trust_env=False)
    return None


def test_stopping_the_workload_closes_every_session(corral: Server) -> None:
    create_web(corral, "victim")
    token = {"Authorization": f"Bearer {corral.tokens['alice']}"}
    checkpoint = corral.cli("exec", "victim", "--", "/bin/sh", "-c", "echo $CORRAL_CHECKPOINT_DIR")
    assert checkpoint.returncode == 0
    with contextlib.ExitStack() as stack:
        sessions_stopped(corral, stack, token, checkpoint.stdout)


def sessions_stopped(
    corral: Server, stack: contextlib.ExitStack, token: dict[str, str], checkpoint: str
) -> None:
    """Three sessions open, then the workspace stopped: each is closed."""
    sleeper = connect(
        corral.ws_url("/api/v1/workloads/victim/exec?command=sleep&command=600"),
        additional_headers=token,
    )
    shell = connect(
        corral.ws_url("/api/v1/workloads/victim/exec?command=/bin/sh&tty=true"),
        additional_headers=token,
    )
    forward = connect(
        corral.ws_url("/api/v1/workloads/victim/ports/main/forward"), additional_headers=token
    )
    for ws in (sleeper, shell, forward):
        stack.enter_context(ws)
    forward.send(b"GET / HTTP/1.0\r\n\r\n")
    assert b"200" in forward.recv(timeout=30)
    # Stopped by its owner (a member manages only their own workloads).
    done = corral.cli("workspace", "stop", "victim")
    assert done.returncode == 0, done.stderr
    for ws in (sleeper, shell, forward):
        ended = []
        try:
            while True:
                ended.append(ws.recv(timeout=30))
        except ConnectionClosed:
            pass
        texts = [m for m in ended if isinstance(m, str)]
        if ws is not forward:
            assert texts and json.loads(texts[-1])["exit"] in (137, 128 + 9), ended
    assert corral.wait_status("victim", "suspended")
    # Started again, it has the same checkpoint directory.
    done = corral.cli("workspace", "start", "victim")
    assert done.returncode == 0, done.stderr
    corral.wait_status("victim", "running")
    again = wait_until(
        lambda: (
            (
                d := corral.cli(
                    "exec", "victim", "--", "/bin/sh", "-c", "echo $CORRAL_CHECKPOINT_DIR"
                )
            ).returncode
            == 0
            and d
        ),
        60,
        "the restarted workspace to run its task",
    )
    assert again.stdout == checkpoint


def test_a_slow_or_vanished_client_blocks_nobody_else(corral: Server, web: str) -> None:
    """A client that stops reading a large answer, and one that goes away in the middle:
    the server goes on answering everyone else, through the proxy too."""
    made = corral.cli("exec", "web", "--", "/bin/sh", "-c", "head -c 67108864 /dev/zero > big.bin")
    assert made.returncode == 0, made.stderr
    host = corral.url.removeprefix("http://")
    address, port = host.split(":")
    request = (
        f"GET /w/team-a/web/big.bin HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {corral.tokens['alice']}\r\n\r\n"
    ).encode()
    with contextlib.ExitStack() as stack:
        slow = stack.enter_context(socket.create_connection((address, int(port))))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall(request)
        assert slow.recv(4096).startswith(b"HTTP/1.1 200")
        gone = socket.create_connection((address, int(port)))
        gone.sendall(request)
        assert gone.recv(4096).startswith(b"HTTP/1.1 200")
        gone.close()
        # The slow one reads nothing more; everyone else is served meanwhile.
        with corral.http("alice") as http:
            for _ in range(5):
                assert http.get("/w/team-a/web/").status_code == 200
                assert http.get("/healthz").status_code == 200


@contextlib.contextmanager
def execs_as_alice(corral: Server, scripts: list[str]) -> Iterator[list[subprocess.Popen[str]]]:
    """`corral exec web -- /bin/sh -c SCRIPT` for each script, all at once, as alice,
    with no input; whichever are still running at the end are killed."""
    sessions = [
        subprocess.Popen(
            [CORRAL, "exec", "web", "--", "/bin/sh", "-c", script],
            env=corral.cli_env("alice"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script in scripts
    ]
    try:
        yield sessions
    finally:
        for session in sessions:
            if session.poll() is None:
                session.kill()
                session.communicate()


def test_sessions_ending_together_each_give_their_own_exit_code(corral: Server, web: str) -> None:
    """Several sessions at once, their input ended at the start (as a script's is) and
    their commands ending together: each client gets its own command's exit code. (A
    session closed its ended input again when it was released, when the number was
    another session's stream or connection by then: clients got 255, or hung.)"""
    scripts = [f"sleep 2; exit {10 + index}" for index in range(6)]
    with execs_as_alice(corral, scripts) as sessions:
        ended = [session.communicate(timeout=60) for session in sessions]
        assert [session.returncode for session in sessions] == [10 + i for i in range(6)], ended


def test_exec_sessions_kept_waiting_on_purpose_stop_nobody_else(corral: Server, web: str) -> None:
    """A member opens more exec sessions than the server has worker threads, each closing
    its output and going on running, so the server waits for each one's exit. Another
    member's requests, which run in the worker threads, are answered meanwhile."""
    linger = 12
    scripts = [f"echo ready; exec >&- 2>&-; exec sleep {linger}"] * (WORKER_THREADS + 2)
    with execs_as_alice(corral, scripts) as sessions:
        for session in sessions:
            assert session.stdout is not None
            assert session.stdout.readline() == "ready\n", session.stderr
        with corral.api("bob") as api:
            for _ in range(WORKER_THREADS + 2):
                answer = api.get("/workloads", timeout=linger / 2)
                assert answer.status_code == 200, answer.text
        # Each session ends with its command, and says how.
        for session in sessions:
            _, errors = session.communicate(timeout=linger + 30)
            assert session.returncode == 0, errors


def test_list_and_open_show_the_url(corral: Server, web: str) -> None:
    listed = corral.cli("workspace", "list", "--json", who="alice")
    assert listed.returncode == 0, listed.stderr
    web = next(item for item in json.loads(listed.stdout) if item["name"] == "web")
    assert web["status"] == "running" and web["ports"] == [
        {"name": "main", "path": "/w/team-a/web/", "ready": True}
    ]
    assert web["idle_seconds"] is not None and web["active_at"] is not None
    assert corral.cli("workspace", "list", who="bob").stdout.count("web") == 0
    opened = corral.cli("open", "web", "--print", who="alice")
    assert opened.returncode == 0 and opened.stdout.strip() == f"{corral.url}/w/team-a/web/"
    refused = corral.cli("open", "web", "--print", who="bob")
    assert refused.returncode != 0 and "not found" in refused.stderr
