"""`corral token list|create|revoke`, `corral user delete`, `corral audit`, and the
credentials `corral submit --export ALL` keeps out of a stored workload."""

from __future__ import annotations

import json
from typing import Any

import httpx
from cli_support import Cli, make, row


def test_tokens_are_created_listed_and_revoked(
    server: Any, admin: Cli, api: httpx.Client, tmp_path: Any
) -> None:
    queue = make(api, "/queues", {"name": "tokq", "deserved": 1})["name"]
    make(api, "/users", {"name": "tok-user", "role": "member", "project": queue})
    done = admin.run("token", "create", "tok-user", "--name", "ci", "--expires", "30d")
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert token.startswith("crl_") and "shown only this once" in done.stderr
    member = Cli(tmp_path / "member", server.url, token)
    assert "tok-user" in member.ok("token", "list")

    listed = admin.json("token", "list", "--user", "tok-user")
    ci = next(t for t in listed if t["name"] == "ci")
    assert ci["expires_at"] is not None and ci["active"] and ci["last_used_at"] is not None
    table = admin.ok("token", "list")
    assert row(table, str(ci["id"]))[1:3] == ["tok-user", "ci"]
    assert token not in table

    assert f"Revoked token {ci['id']}." in admin.ok("token", "revoke", str(ci["id"]))
    assert row(admin.ok("token", "list"), str(ci["id"]))[-1] == "revoked"
    assert "not valid" in member.fails("token", "list", code=1)
    # The admin's only token cannot be revoked: nobody could administer the server.
    (own,) = admin.json("token", "list", "--user", "admin")
    line = admin.fails("token", "revoke", str(own["id"]), code=1)
    assert "last usable admin token" in line
    assert admin.fails("token", "create", "tok-user", "--expires", "soon", code=2)


def test_user_delete_and_audit(server: Any, admin: Cli, api: httpx.Client, tmp_path: Any) -> None:
    queue = make(api, "/queues", {"name": "delq", "deserved": 1})["name"]
    token = make(api, "/users", {"name": "gone", "role": "member", "project": queue})["token"]
    gone = Cli(tmp_path / "gone", server.url, token)
    assert "gone" in gone.ok("token", "list")
    assert "Deleted gone" in admin.ok("user", "delete", "gone")
    gone.fails("token", "list", code=1)
    assert admin.fails("user", "delete", "gone", code=1) == "user 'gone' not found"

    table = admin.ok("audit", "--since", "1h", "--action", "DELETE /api/v1/users")
    assert "/api/v1/users/gone" in table and "204" in table and "404" in table
    lines = admin.ok("audit", "--user", "admin", "--outcome", "404", "--json").splitlines()
    records = [json.loads(line) for line in lines]
    assert records and {r["status"] for r in records} == {404}
    assert any(r["path"] == "/api/v1/users/gone" for r in records)
    assert admin.fails("audit", "--since", "yesterday", code=2).startswith("--since:")
    # Not an admin: refused.
    viewer = make(api, "/users", {"name": "audit-viewer", "role": "viewer"})["token"]
    Cli(tmp_path / "viewer", server.url, viewer).fails("audit", code=1)


# Values that carry a credential under names that do not say so: what a member's shell
# holds, and what `--export ALL` stored in clear in the workload's spec (issue 44).
CREDENTIALS = {
    "DATABASE_URL": "postgres://user:hunter2-db@db.internal/app",
    "PIP_INDEX_URL": "https://build:hunter2-pip@pypi.internal/simple",
    "DEPLOY_KEY_PEM": "-----BEGIN OPENSSH PRIVATE KEY-----\nhunter2-pem\n"
    "-----END OPENSSH PRIVATE KEY-----\n",
    "CI_HELPER": "ghp_hunter2" + "x" * 30,
    "SERVICE_DSN": "host=db user=app password=hunter2-dsn",
}


def test_export_all_leaves_out_values_that_carry_credentials_and_names_them(
    admin: Cli, api: httpx.Client
) -> None:
    queue = make(api, "/queues", {"name": "expq", "deserved": 1})["name"]
    shell = {
        **CREDENTIALS,
        "MY_API_TOKEN": "hunter2-by-name",
        "PLAIN_URL": "https://pypi.org/simple",
        "GIT_URL": "ssh://git@github.com/org/repo.git",
    }
    done = admin.run("submit", "creds", "-p", queue, "--", "true", env=shell)
    assert done.returncode == 0, done.stderr

    env = api.get("/workloads/creds").json()["env"]
    assert not set(CREDENTIALS) & set(env), env
    assert "hunter2" not in str(env)
    assert (env["PLAIN_URL"], env["GIT_URL"]) == (shell["PLAIN_URL"], shell["GIT_URL"])
    # Said by name, on stderr, never with a value.
    note = next(line for line in done.stderr.splitlines() if "--export ALL left out" in line)
    for name in (*CREDENTIALS, "MY_API_TOKEN"):
        assert name in note, note
    assert "hunter2" not in done.stderr + done.stdout

    # One given with -e, or named in --export, is the submitter's choice: kept, not noted.
    given = admin.run(
        "submit", "creds-given", "-p", queue, "-e", "DATABASE_URL=hunter2-given",
        "--dry-run", "--", "true", env=shell,
    )  # fmt: skip
    assert given.returncode == 0, given.stderr
    assert "DATABASE_URL: hunter2-given" in given.stdout
    assert "DATABASE_URL" not in given.stderr and "PIP_INDEX_URL" in given.stderr
    named = admin.run(
        "submit", "-p", queue, "--export", "DATABASE_URL", "--dry-run", "--", "true", env=shell
    )
    assert named.returncode == 0 and "left out" not in named.stderr, named.stderr
    # A refused submission answers with its one error line, and no note.
    refused = admin.run("submit", "-p", "no-such-project", "--", "true", env=shell)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused
