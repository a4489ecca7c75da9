"""`corral exec`, `corral shell` and `corral port-forward`: WebSockets to the server, which
runs the command beside the task (as its Unix account, in its environment) or connects
to one of its declared ports (see corral.workspaces.exec_bridge)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import termios
import threading
import tty
from collections.abc import Callable
from types import FrameType
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from corral.cli.common import CliError, InProject, InvalidInput, addressed, reported_errors
from corral.cli.config import credentials
from corral.sdk.client import workload_address

CHUNK = 64 * 1024
# The close code of a session the server ended because its user lost access.
ACCESS_ENDED = 1008


def _ws_url(path: str, query: dict[str, Any] | None = None) -> tuple[str, str]:
    found = credentials()
    base = found.server.rstrip("/")
    scheme = "wss" if base.startswith("https://") else "ws"
    url = f"{scheme}://{base.split('://', 1)[1]}/api/v1{path}"
    if query:
        url += "?" + urlencode(query, doseq=True)
    return url, found.token


def open_socket(path: str, query: dict[str, Any] | None = None) -> ClientConnection:
    """A WebSocket to the server, authenticated by the logged-in token; CliError with the
    server's reason when it refuses."""
    url, token = _ws_url(path, query)
    try:
        return connect(
            url,
            additional_headers={"Authorization": f"Bearer {token}"},
            max_size=16 << 20,
            open_timeout=30,
            proxy=None,
        )
    except InvalidStatus as error:
        body = error.response.body or b""
        try:
            detail = json.loads(body)["detail"]
        except (ValueError, KeyError, TypeError):
            detail = body.decode("utf-8", "replace") or "refused"
        raise CliError(f"{error.response.status_code}: {detail}") from None
    except OSError as error:
        raise CliError(f"cannot reach the server: {error}") from None


def _session_query(command: list[str], tty_wanted: bool, task: int) -> dict[str, Any]:
    return {"command": command, "tty": "true" if tty_wanted else "false", "task": str(task)}


def run_session(name: str, command: list[str], tty_wanted: bool, task: int) -> int:
    """Run a command beside the task with our stdin, stdout and stderr; its exit code."""
    segment, query = workload_address(name)
    query.update(_session_query(command, tty_wanted, task))
    with open_socket(f"/workloads/{segment}/exec", query) as ws:
        return _attached(ws, tty_wanted)


def _attached(ws: ClientConnection, tty_wanted: bool) -> int:
    """Our terminal or streams attached to the session until it ends; its exit code."""
    restore: Callable[[], None] = lambda: None  # noqa: E731
    if tty_wanted and sys.stdin.isatty():
        saved = termios.tcgetattr(sys.stdin.fileno())
        tty.setraw(sys.stdin.fileno())

        def restore() -> None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)

        _send_size(ws)
        signal.signal(signal.SIGWINCH, lambda number, frame: _send_size(ws))
    feeder = threading.Thread(target=_feed, args=(ws, tty_wanted), daemon=True)
    feeder.start()
    code = 255
    try:
        for message in ws:
            if isinstance(message, bytes):
                stream = sys.stdout if message[:1] == b"\x01" else sys.stderr
                stream.buffer.write(message[1:])
                stream.buffer.flush()
            else:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    code = int(json.loads(message)["exit"])
    except ConnectionClosed:
        pass
    finally:
        restore()
    _say_why_ended(ws)
    return code


def _say_why_ended(ws: ClientConnection) -> None:
    """The server's reason, when it ended the session because its user lost access (the
    token revoked or expired, the user out of the project)."""
    if ws.close_code == ACCESS_ENDED:
        print(f"corral: {ws.close_reason}", file=sys.stderr)


def _send_size(ws: ClientConnection) -> None:
    with contextlib.suppress(OSError, ConnectionClosed):
        size = os.get_terminal_size(sys.stdin.fileno())
        ws.send(json.dumps({"resize": [size.lines, size.columns]}))


def _feed(ws: ClientConnection, tty_wanted: bool) -> None:
    """Our stdin to the session, then end-of-input."""
    fd = sys.stdin.fileno()
    try:
        while True:
            data = os.read(fd, CHUNK)
            if not data:
                break
            ws.send(data)
        if not tty_wanted:
            ws.send(json.dumps({"eof": True}))
    except (OSError, ConnectionClosed):
        return


def exec_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The workload.")],
    command: Annotated[list[str], typer.Argument(help="The command, after --.")],
    task: Annotated[int, typer.Option("--task", min=0, help="Which task.")] = 0,
    tty_wanted: Annotated[bool, typer.Option("--tty", "-t", help="With a terminal.")] = False,
    project: InProject = None,
) -> None:
    """Run a command beside a running task, in its environment; exits with its code."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx):
        code = run_session(name, command, tty_wanted, task)
    raise typer.Exit(code)


def shell_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The workload.")],
    project: InProject = None,
    task: Annotated[int, typer.Option("--task", min=0, help="Which task.")] = 0,
    shell: Annotated[str, typer.Option("--shell", help="The shell, on the node.")] = "/bin/bash",
) -> None:
    """An interactive shell beside a running task, with a terminal, in its environment."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx):
        code = run_session(name, [shell, "-i"], True, task)
    raise typer.Exit(code)


# A declared port's name (as the server's schema has it): it starts with a letter.
PORT_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
FORWARD_FORMS = (
    "LOCAL:REMOTE (8888:8888, 8888:main), PORT (8888, the same on both sides) "
    "or :REMOTE (any free local port)"
)


def parse_forward(text: str) -> tuple[int, str]:
    """A port-forward's LOCAL:REMOTE, as kubectl reads it: `8888:8888`, `8888` (the same
    port on both sides), `:8888` (any free local port, 0). REMOTE is a declared port's
    name or its number on the node. InvalidInput naming what is wrong."""
    local, sep, remote = text.partition(":")
    if not sep:
        if PORT_NAME.match(text):
            raise InvalidInput(f"{text!r}: a port name needs a local port: LOCAL:{text} or :{text}")
        local = remote = text
    if not remote:
        raise InvalidInput(f"{text!r}: REMOTE is missing; give {FORWARD_FORMS}")
    if ":" in remote:
        raise InvalidInput(f"{text!r}: one colon at most; give {FORWARD_FORMS}")
    if local and not (local.isdigit() and int(local) <= 65535):
        raise InvalidInput(f"{text!r}: LOCAL must be a port number from 0 to 65535")
    if remote.isdigit():
        if not 1 <= int(remote) <= 65535:
            raise InvalidInput(f"{text!r}: REMOTE must be a port number from 1 to 65535")
        remote = str(int(remote))
    elif not PORT_NAME.match(remote):
        raise InvalidInput(
            f"{text!r}: REMOTE must be a port number or a declared port's name "
            "(lowercase letters, digits and -, starting with a letter)"
        )
    return int(local or 0), remote


def port_forward_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The workload.")],
    mapping: Annotated[
        str,
        typer.Argument(
            help="LOCAL:REMOTE, PORT or :REMOTE; REMOTE a declared port's name or its number "
            "on the node; no LOCAL: any free port."
        ),
    ],
    address: Annotated[str, typer.Option("--address", help="Where to listen.")] = "127.0.0.1",
    project: InProject = None,
) -> None:
    """Forward a local port to a declared port of the workload's task, until interrupted."""
    name = addressed(ctx, name, project)
    with reported_errors(ctx):
        local, port = parse_forward(mapping)
        # Refused here (unknown workload, outsider, undeclared port) before listening.
        with open_socket(*_forward_path(name, port)):
            pass
        try:
            listener = socket.create_server((address, local))
        except OSError as error:
            raise CliError(f"cannot listen on {address}:{local}: {error.strerror}") from None
        typer.echo(f"Forwarding {address}:{listener.getsockname()[1]} -> {name}:{port}", err=True)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            while True:
                client, _ = listener.accept()
                threading.Thread(target=_forward, args=(client, name, port), daemon=True).start()
        except KeyboardInterrupt:
            pass
        finally:
            listener.close()


def _interrupt(number: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _forward_path(name: str, port: str) -> tuple[str, dict[str, Any]]:
    """The path and query of a port-forward to workload NAME or PROJECT/NAME."""
    segment, query = workload_address(name)
    return f"/workloads/{segment}/ports/{quote(port, safe='')}/forward", dict(query)


def _forward(client: socket.socket, name: str, port: str) -> None:
    """One local connection over its own WebSocket, both ways, until either side closes."""
    try:
        ws = open_socket(*_forward_path(name, port))
    except CliError as error:
        print(f"corral: {error}", file=sys.stderr)
        client.close()
        return

    def upstream() -> None:
        try:
            while data := client.recv(CHUNK):
                ws.send(data)
        except (OSError, ConnectionClosed):
            pass
        finally:
            with contextlib.suppress(Exception):
                ws.close()

    with ws:
        threading.Thread(target=upstream, daemon=True).start()
        _downstream(ws, client)


def _downstream(ws: ClientConnection, client: socket.socket) -> None:
    try:
        for message in ws:
            if isinstance(message, bytes):
                client.sendall(message)
    except (OSError, ConnectionClosed):
        pass
    finally:
        _say_why_ended(ws)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        client.close()
