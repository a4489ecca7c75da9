"""One origin per workspace (`corral up --workspace-domain ws.test`): a browser logged in
on the server's host is sent to NAME-ID.ws.test with a one-time ticket, gets that host's
own cookie, and a workspace's page can reach neither another workspace nor the API with
the user's credentials. HTTP checks with Host headers, then the same in Chromium, whose
resolver maps *.ws.test to 127.0.0.1."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from ws_support import Server, start_server, stop_server

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

DOMAIN = "ws.test"
# Workspace name -> the label of its host (NAME-ID), once the module's server made them.
LABELS: dict[str, str] = {}
SERVE = 'exec "$0" -m http.server --bind "$CORRAL_HOST" "$CORRAL_PORT"'
HTML = {"Accept": "text/html"}


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with a workspace domain; alice in team-a (its project-admin, who enters
    the admin's workspaces), bob in team-b; the workspaces web and web2 in team-a."""
    data_dir = tmp_path_factory.mktemp("corral-origins")
    server = start_server(data_dir, "--workspace-domain", DOMAIN)
    try:
        with server.api() as api:
            for project in ("team-a", "team-b"):
                assert api.post("/queues", json={"name": project, "deserved": 1}).is_success
            for name, project in (("alice", "team-a"), ("bob", "team-b")):
                body = {"name": name, "role": "member", "project": project, "unix_user": "nobody"}
                answer = api.post("/users", json=body)
                assert answer.status_code == 201, answer.text
                server.tokens[name] = answer.json()["token"]
            answer = api.put("/users/alice/projects/team-a", json={"role": "project-admin"})
            assert answer.status_code == 200, answer.text
        for name in ("web", "web2"):
            done = server.cli(
                "workspace", "create", name, "-p", "team-a", "-g", "0",
                "--", "/bin/sh", "-c", SERVE, sys.executable,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            # Its own host is named NAME-ID: names are unique only within a project.
            with server.api("admin") as api:
                found = api.get(f"/workloads/{name}", params={"project": "team-a"}).json()
            LABELS[name] = f"{name}-{found['id']}"
        yield server
    finally:
        stop_server(server.process, data_dir)


def port_of(corral: Server) -> int:
    return int(corral.url.rpartition(":")[2])


def host(corral: Server, workload: str) -> dict[str, str]:
    return {"Host": f"{LABELS[workload]}.{DOMAIN}:{port_of(corral)}"}


def client(corral: Server) -> httpx.Client:
    """No credentials of its own; requests to 127.0.0.1 whatever host they name."""
    return httpx.Client(base_url=corral.url, timeout=30, trust_env=False)


def handoff(corral: Server, http: httpx.Client, who: str, path: str) -> str:
    """The entry URL of the page that sends a browser logged in as `who` on its way."""
    http.cookies.set("corral_token", corral.tokens[who])
    try:
        sent = http.get(path, headers=HTML)
    finally:
        http.cookies.clear()
    assert sent.status_code == 200, sent.text
    assert sent.headers["referrer-policy"] == "no-referrer"
    found = re.search(r'content="0;url=([^"]+)"', sent.text)
    assert found is not None, sent.text
    return html.unescape(found.group(1))


def enter(corral: Server, http: httpx.Client, who: str, workload: str) -> str:
    """The way of a browser logged in as `who`: the server's host sends it to the
    workspace's host with a ticket; the ticket is traded for that host's cookie."""
    location = urlsplit(handoff(corral, http, who, f"/w/team-a/{workload}/?x=1"))
    netloc = f"{LABELS[workload]}.{DOMAIN}:{port_of(corral)}"
    assert (location.scheme, location.netloc) == ("http", netloc)
    assert location.path == "/_corral/enter"
    query = parse_qs(location.query)
    assert query["next"] == [f"/w/team-a/{workload}/?x=1"]
    entered = http.get(f"{location.path}?{location.query}", headers=host(corral, workload))
    assert entered.status_code == 303, entered.text
    assert entered.headers["location"] == f"/w/team-a/{workload}/?x=1"
    cookie = entered.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
    assert "Domain" not in cookie  # its own host only
    # The ticket was good once.
    again = http.get(f"{location.path}?{location.query}", headers=host(corral, workload))
    assert again.status_code == 403
    value: str = entered.cookies["corral_ws"]
    return value


def test_a_browser_gets_to_the_workspace_at_its_own_host(corral: Server) -> None:
    with client(corral) as http:
        session = enter(corral, http, "alice", "web")
        mine = {**host(corral, "web"), "Cookie": f"corral_ws={session}"}
        listing = http.get("/w/team-a/web/", headers=mine)
        assert listing.status_code == 200 and "Directory listing" in listing.text
        # That host serves that workspace and nothing else: not another's paths, not the
        # API, not the dashboard.
        for path in ("/w/team-a/web2/", "/api/v1/workloads", "/login", "/"):
            assert http.get(path, headers=mine).status_code == 404, path
        # The session is that workspace's: on another's host it is nobody's.
        theirs = {**host(corral, "web2"), "Cookie": f"corral_ws={session}"}
        assert http.get("/w/team-a/web2/", headers=theirs).status_code == 401
        # A write from another workspace's page (its Origin) is refused.
        origin = {"Origin": f"http://{LABELS['web2']}.{DOMAIN}:{port_of(corral)}"}
        assert http.post("/w/team-a/web/", headers={**mine, **origin}).status_code == 403
        # A ticket is the workspace's it was made for.
        entry = urlsplit(handoff(corral, http, "alice", "/w/team-a/web/"))
        crossed = http.get(f"{entry.path}?{entry.query}", headers=host(corral, "web2"))
        assert crossed.status_code == 403


def test_the_servers_host_keeps_scripts_and_refuses_outsiders(corral: Server) -> None:
    with client(corral) as http:
        # Scripts (a bearer token) are served on the server's host as before.
        bearer = {"Authorization": f"Bearer {corral.tokens['alice']}"}
        assert http.get("/w/team-a/web/", headers=bearer).status_code == 200
        # And on the workspace's host.
        assert (
            http.get("/w/team-a/web/", headers={**bearer, **host(corral, "web")}).status_code == 200
        )
        # A browser's write to the server's host is not proxied there.
        http.cookies.set("corral_token", corral.tokens["alice"])
        assert http.post("/w/team-a/web/").status_code == 403
        # An outsider gets no ticket; nobody gets in without credentials.
        http.cookies.set("corral_token", corral.tokens["bob"])
        assert http.get("/w/team-a/web/", headers=HTML).status_code == 404
        http.cookies.clear()
        assert http.get("/w/team-a/web/", headers=host(corral, "web")).status_code == 401
        assert (
            http.get("/_corral/enter?ticket=guess", headers=host(corral, "web")).status_code == 403
        )


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """Headless Chromium resolving every *.ws.test to 127.0.0.1."""
    if not CHROMIUM.exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{CHROMIUM} is missing; CI must install Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-origins")),
            executable_path=str(CHROMIUM),
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                f"--host-resolver-rules=MAP *.{DOMAIN} 127.0.0.1",
            ],
            headless=True,
        )
        context.set_default_timeout(30_000)
        yield context
        context.close()


def test_in_chromium_a_workspace_page_cannot_reach_another(
    browser: BrowserContext, corral: Server
) -> None:
    page = browser.new_page()
    page.goto(f"{corral.url}/login?next=/w/team-a/web/")
    page.fill("#token", corral.tokens["alice"])
    page.click("button[type=submit]")
    home = f"http://{LABELS['web']}.{DOMAIN}:{port_of(corral)}/w/team-a/web/"
    try:
        page.wait_for_url(home)
    except Exception:
        raise AssertionError(f"at {page.url}: {page.content()[:500]}") from None
    assert "Directory listing" in page.content()
    names = {c["name"]: c for c in browser.cookies()}
    assert (
        names["corral_ws"]["domain"] == f"{LABELS['web']}.{DOMAIN}"
        and names["corral_ws"]["httpOnly"]
    )
    # From web's page: another workspace's origin and the server's API both refuse to be
    # read, and the user's cookies are out of the page's reach.
    results = page.evaluate(
        """async ([other, api]) => {
            const out = {cookie: document.cookie};
            for (const [key, url] of [["other", other], ["api", api]]) {
                try {
                    const answer = await fetch(url, {credentials: "include"});
                    out[key] = answer.status + " " + (await answer.text()).slice(0, 40);
                } catch (error) {
                    out[key] = "refused";
                }
            }
            return out;
        }""",
        [
            f"http://{LABELS['web2']}.{DOMAIN}:{port_of(corral)}/w/team-a/web2/",
            f"{corral.url}/api/v1/workloads",
        ],
    )
    assert results == {"cookie": "", "other": "refused", "api": "refused"}, results
    page.close()


def test_a_bad_workspace_domain_is_refused_before_starting(tmp_path: Path) -> None:
    data = tmp_path / "data"
    corral = str(Path(sys.executable).with_name("corral"))
    done = subprocess.run(
        [corral, "up", "--workspace-domain", "ws.exa mple", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--workspace-domain: 'ws.exa mple' is not a domain name" in done.stderr
    assert not data.exists()
