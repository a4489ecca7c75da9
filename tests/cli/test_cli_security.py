"""`corral token list|create|revoke`, `corral user delete` and `corral audit`."""

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
