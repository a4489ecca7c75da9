"""`corral login`, credentials from the config file and the environment, `corral user`,
who may do what, and how errors look."""

from __future__ import annotations

import stat
import tomllib
import typing
from pathlib import Path
from typing import Any

import httpx
from cli_support import Cli, make, row

from corral.sdk import types


def test_login_checks_the_token_and_saves_it_for_the_owner_only(
    server: Any, tmp_path: Path
) -> None:
    cli = Cli(tmp_path)
    out = cli.ok("login", "--server", f"{server.url}/", "--token", server.token)
    assert f"Logged in to {server.url} as admin (admin)." in out
    path = tmp_path / ".config" / "corral" / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tomllib.loads(path.read_text()) == {"server": server.url, "token": server.token}
    # Later commands read the file: no CORRAL_* in this Cli's environment.
    assert "admin" in cli.ok("user", "list")


def test_login_follows_xdg_config_home_and_tightens_an_existing_file(
    server: Any, tmp_path: Path
) -> None:
    config_home = tmp_path / "xdg"
    path = config_home / "corral" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text('server = "http://old:1"\ntoken = "old"\ncolour = "blue"\n')
    path.chmod(0o644)
    cli = Cli(tmp_path / "home", config_home=config_home)
    cli.ok("login", "--server", server.url, "--token", server.token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    saved = tomllib.loads(path.read_text())
    assert saved == {"server": server.url, "token": server.token, "colour": "blue"}
    assert not (tmp_path / "home" / ".config" / "corral").exists()


def test_a_bad_token_or_server_is_refused_and_nothing_is_saved(server: Any, tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    assert cli.fails("login", "--server", server.url, "--token", "crl_nope", code=1) == (
        f"{server.url} does not accept this token"
    )
    assert cli.fails("login", "--server", "ftp://x", "--token", "t", code=2) == (
        "--server: 'ftp://x' is not an http:// or https:// URL"
    )
    line = cli.fails("login", "--server", "http://127.0.0.1:9", "--token", "t", code=1)
    assert line.startswith("cannot reach the corral server at http://127.0.0.1:9: ")
    assert not (tmp_path / ".config" / "corral").exists()
    assert cli.fails("list", code=1).startswith("not logged in: run corral login")


def test_the_environment_overrides_the_config_file(
    server: Any, api: httpx.Client, tmp_path: Path
) -> None:
    make(api, "/queues", {"name": "env-proj"})
    member_token = make(api, "/users", {"name": "env-member", "project": "env-proj"})["token"]
    cli = Cli(tmp_path)
    cli.ok("login", "--server", server.url, "--token", server.token)
    assert "env-member" in cli.ok("user", "list")
    # CORRAL_TOKEN wins over the admin token in the file: a member may not list users.
    as_member = Cli(tmp_path, token=member_token)
    assert as_member.fails("user", "list", code=1) == (
        "env-member is a member; this needs an admin"
    )
    # CORRAL_SERVER wins over the file's server.
    elsewhere = Cli(tmp_path, server="http://127.0.0.1:9")
    assert elsewhere.fails("list", code=1).startswith(
        "cannot reach the corral server at http://127.0.0.1:9: "
    )


def test_admins_create_users_and_tokens(server: Any, admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "acct-proj"})
    created = admin.run("user", "create", "acct-alice", "--project", "acct-proj")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert "\n" not in token and token.startswith("crl_")
    assert "Created acct-alice (member of acct-proj)." in created.stderr
    admin.ok("user", "create", "acct-viv", "--role", "viewer", "--unix-user", "vivian")
    listed = admin.ok("user", "list")
    assert row(listed, "acct-alice") == [
        "acct-alice",
        "member",
        "acct-proj (member)",
        "acct-alice",
    ]
    assert row(listed, "acct-viv") == ["acct-viv", "viewer", "-", "vivian"]
    assert admin.json("user", "list") == api.get("/users").json()
    second = admin.ok("user", "token", "acct-alice").strip()
    assert second != token
    first = {"project": "acct-proj", "role": "member"}
    for each in (token, second):
        whoami = httpx.get(f"{server.api}/whoami", headers={"Authorization": f"Bearer {each}"})
        assert whoami.json() == {
            "name": "acct-alice",
            "role": "member",
            "project": "acct-proj",
            "projects": [first],
            "unix_user": "acct-alice",
        }

    # A second project, as its project-admin; then out of the first.
    make(api, "/queues", {"name": "acct-two"})
    added = admin.run("user", "add-project", "acct-alice", "acct-two", "--role", "project-admin")
    assert added.returncode == 0, added.stderr
    assert "acct-proj (member), acct-two (project-admin)" in added.stderr
    listed = admin.ok("user", "list")
    assert "acct-proj (member), acct-two" in listed and "(project-admin)" in listed
    admin.ok("user", "remove-project", "acct-alice", "acct-proj")
    users = {u["name"]: u for u in api.get("/users").json()}
    assert users["acct-alice"]["projects"] == [{"project": "acct-two", "role": "project-admin"}]
    assert users["acct-alice"]["project"] == "acct-two"
    assert admin.fails("user", "remove-project", "acct-alice", "acct-proj", code=1) == (
        "acct-alice is not a member of 'acct-proj'"
    )
    assert admin.fails("user", "add-project", "acct-viv", "acct-two", code=2) == (
        "only members belong to projects; acct-viv is a viewer"
    )


def test_user_errors(admin: Cli) -> None:
    assert admin.fails("user", "create", "acct-nobody", code=2) == "a member needs a project"
    assert admin.fails("user", "token", "acct-ghost", code=1) == "user 'acct-ghost' not found"
    assert admin.run("user", "create", "acct-x", "--role", "boss").returncode == 2
    # Only the operator may map the admin to root, never a user created through the API.
    root = admin.run("user", "create", "acct-r", "--role", "viewer", "--unix-user", "root")
    assert root.returncode == 2 and "root" in root.stderr, root.stderr


def test_a_member_submits_to_their_own_project_only(
    server: Any, admin: Cli, api: httpx.Client, tmp_path: Path
) -> None:
    make(api, "/queues", {"name": "own-a"})
    make(api, "/queues", {"name": "own-b"})
    member = Cli(
        tmp_path, server.url, make(api, "/users", {"name": "own-m", "project": "own-a"})["token"]
    )
    assert member.fails("submit", "-p", "own-b", "-g", "1", "--", "true", code=1) == (
        "own-m is a member of own-a, not of own-b"
    )
    # -p defaults to the member's project.
    out = member.ok("submit", "own-job", "-g", "1", "--", "true")
    assert out == "Submitted own-job to own-a (pending).\n"
    assert api.get("/workloads/own-job").json()["user"] == "own-m"
    assert api.get("/workloads", params={"project": "own-b"}).json() == []
    # A member's list shows their project by default.
    assert "own-job" in member.ok("list")
    viewer = Cli(
        tmp_path, server.url, make(api, "/users", {"name": "own-v", "role": "viewer"})["token"]
    )
    assert viewer.fails("submit", "-p", "own-a", "--", "true", code=1) == (
        "own-v is a viewer and may only read"
    )
    # An admin has no project of their own to default to.
    assert admin.fails("submit", "-g", "1", "--", "true", code=2) == (
        "-p/--project: give the project; admin (admin) has none of their own"
    )


def test_errors_show_no_traceback_unless_asked_with_debug(admin: Cli) -> None:
    assert admin.fails("describe", "no-such-job", code=1) == "workload 'no-such-job' not found"
    # In red where colour is shown.
    colour = {"FORCE_COLOR": "1", "NO_COLOR": "", "TERM": "xterm"}
    coloured = admin.run("describe", "no-such-job", env=colour)
    assert coloured.stderr == "\x1b[31mworkload 'no-such-job' not found\x1b[0m\n"
    debug = admin.run("--debug", "describe", "no-such-job")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "ApiError" in debug.stderr


def test_the_sdk_types_match_the_api(api: httpx.Client) -> None:
    """Every typed dictionary of corral.sdk.types has the fields of the schema of the same
    name in the server's OpenAPI document, so that the CLI's reading of them is right."""
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    checked = 0
    for name, kind in vars(types).items():
        if typing.is_typeddict(kind):
            assert set(kind.__annotations__) == set(schemas[name]["properties"]), name
            checked += 1
    assert checked >= 14
