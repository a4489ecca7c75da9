"""`corral workspace create|list|stop|start` and `corral open`: interactive workloads with
ports, reached through the server's proxy at /w/NAME/ (docs/workspaces.md)."""

from __future__ import annotations

import sys
import time
import webbrowser
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from corral.cli.common import InvalidInput, parse_pairs, print_json, reported_errors
from corral.cli.config import connect, credentials
from corral.cli.submit import parse_gpus, port_names
from corral.sdk import Client
from corral.sdk.types import WorkspaceOut

workspace_app = typer.Typer(help="Workspaces: Jupyter, shells and web apps on pooled GPUs.")
# Jupyter Server (JupyterLab when installed) under the proxy's path, listening where the
# agent says, with no token of its own: corral decides who gets in. Its XSRF check is off
# because corral's cookie is SameSite=Strict and the proxy refuses cross-site requests.
JUPYTER = (
    'if "$0" -c "import jupyterlab" 2>/dev/null; then app=jupyterlab; else app=jupyter_server; fi; '
    'exec "$0" -m "$app" --no-browser --ServerApp.ip="$CORRAL_HOST" '
    '--ServerApp.port="$CORRAL_PORT" --ServerApp.port_retries=0 '
    '--ServerApp.base_url="$CORRAL_BASE_URL" --IdentityProvider.token= '
    "--ServerApp.password= --ServerApp.disable_check_xsrf=True "
    "--ServerApp.allow_remote_access=True --ServerApp.root_dir=. --allow-root"
)


def jupyter_command(python: str) -> list[str]:
    """The command that starts Jupyter with `python` (which must have jupyter_server)."""
    return ["/bin/sh", "-c", JUPYTER, python]


@workspace_app.command("create")
def create_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The workspace's name.")],
    command: Annotated[
        list[str] | None, typer.Argument(help="What to run, after --.", show_default=False)
    ] = None,
    project: Annotated[str | None, typer.Option("--project", "-p", help="Its project.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", "-g", help="GPUs, e.g. 1 or 0.5.")] = None,
    port: Annotated[
        list[str] | None,
        typer.Option("--port", metavar="NAME", help="A port it listens on (main by default)."),
    ] = None,
    jupyter: Annotated[
        bool, typer.Option("--jupyter", help="Run Jupyter Server (JupyterLab if installed).")
    ] = False,
    python: Annotated[
        str, typer.Option("--python", help="The Python that runs Jupyter, on the node.")
    ] = sys.executable,
    base_url: Annotated[
        bool,
        typer.Option("--base-url", help="It serves under $CORRAL_BASE_URL: pass full paths."),
    ] = False,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", metavar="KEY=VALUE", help="A variable.")
    ] = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for it to answer; 0: do not wait.")
    ] = 120.0,
) -> None:
    """Create a workspace: interactive (build) work with ports, reached at /w/NAME/."""
    with reported_errors(ctx):
        if jupyter and command:
            raise InvalidInput("give --jupyter or a command after --, not both")
        if not jupyter and not command:
            raise InvalidInput("give --jupyter or the command to run after --")
        names = port_names(port or ["main"])
        task: dict[str, Any] = {"replicas": 1}
        if gpu is not None:
            task["gpu"] = parse_gpus(gpu)
        variables = dict(parse_pairs("-e/--env", env or []))
        if jupyter:
            command = jupyter_command(python)
            # Jupyter keeps its runtime files in the workload's own directory.
            variables.setdefault("JUPYTER_RUNTIME_DIR", ".jupyter/runtime")
            variables.setdefault("JUPYTER_DATA_DIR", ".jupyter/data")
            variables.setdefault("JUPYTER_CONFIG_DIR", ".jupyter/config")
            variables.setdefault("IPYTHONDIR", ".ipython")
        body: dict[str, Any] = {
            "name": name,
            "tasks": [task],
            "priority": "build",
            "command": command,
            "env": variables,
            "ports": [
                {"name": n, "base_url": base_url or (jupyter and n == "main")} for n in names
            ],
        }
        with connect() as client:
            if project is None:
                from corral.cli.submit import own_project

                project = own_project(client, "-p/--project")
            body["project"] = project
            created = client.submit(body)
            typer.echo(f"Created workspace {created['name']} in {created['project']}.")
            if wait > 0:
                ready = wait_ready(client, name, wait)
                typer.echo(ready)


def url_of(server: str, path: str) -> str:
    return server.rstrip("/") + path


def wait_ready(client: Client, name: str, timeout: float) -> str:
    """Wait until the workspace's main port answers through the proxy; its URL."""
    deadline = time.monotonic() + timeout
    url = url_of(client.server, f"/w/{name}/")
    found = client.get_workspace(name)
    while time.monotonic() < deadline:
        found = client.get_workspace(name)
        if found["status"] in ("failed", "succeeded", "suspended"):
            raise InvalidInput(f"{name} is {found['status']}: see corral describe {name}")
        ready = found["ports"] and all(p["ready"] for p in found["ports"])
        if found["status"] == "running" and ready:
            url = url_of(client.server, found["ports"][0]["path"])
            token = credentials().token
            try:
                answer = httpx.get(
                    url, headers={"Authorization": f"Bearer {token}"}, timeout=5, trust_env=False
                )
                if answer.status_code not in (409, 502, 503):
                    return url
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    return f"{url} (not answering yet after {timeout:g} s; status {found['status']})"


def _idle(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


@workspace_app.command("list")
def list_command(
    ctx: typer.Context,
    project: Annotated[str | None, typer.Option("--project", "-p")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Workspaces of your projects, with their URLs and idle time."""
    with reported_errors(ctx):
        with connect() as client:
            found: list[WorkspaceOut] = client.list_workspaces(project)
            server = client.server
        if as_json:
            print_json(found)
            return
        table = Table("name", "project", "user", "status", "node", "idle", "url", box=None)
        for item in found:
            main = item["ports"][0]["path"] if item["ports"] else ""
            table.add_row(
                item["name"],
                item["project"],
                item["user"],
                item["status"],
                item["node"] or "-",
                _idle(item["idle_seconds"]),
                url_of(server, main) if item["status"] == "running" else "-",
            )
        Console(width=200).print(table)


@workspace_app.command("stop")
def stop_command(ctx: typer.Context, name: str) -> None:
    """Stop a workspace: its devices go back to the pool; `start` brings it back with the
    same checkpoint directory."""
    with reported_errors(ctx):
        with connect() as client:
            client.get_workspace(name)
            done = client.suspend(name)
        typer.echo(f"Stopped {done['name']} ({done['status']}).")


@workspace_app.command("start")
def start_command(ctx: typer.Context, name: str) -> None:
    """Start a stopped workspace again."""
    with reported_errors(ctx):
        with connect() as client:
            client.get_workspace(name)
            done = client.resume(name)
        typer.echo(f"Started {done['name']} ({done['status']}).")


def open_command(
    ctx: typer.Context,
    name: str,
    port: Annotated[str, typer.Option("--port", help="Which port.")] = "main",
    print_only: Annotated[bool, typer.Option("--print", help="Print the URL only.")] = False,
) -> None:
    """Open a workspace in the browser (log in on the dashboard first), or print its URL."""
    with reported_errors(ctx):
        with connect() as client:
            found = client.get_workspace(name)
            server = client.server
        paths = {p["name"]: p["path"] for p in found["ports"]}
        if port not in paths:
            raise InvalidInput(f"--port: {name} declares no port {port!r}")
        url = url_of(server, paths[port])
        typer.echo(url)
        if not print_only and sys.stdout.isatty():
            webbrowser.open(url)
