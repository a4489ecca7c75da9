"""A live `corral up` with two projects and four users for the workspace tests, and a
Jupyter Server workspace in team-a."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ws_support import Server, start_server, stop_server


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server, projects team-a and team-b, alice (team-a's project-admin, so that she
    enters the admin's workspaces there), mia (a member of team-a, who enters only her
    own), bob (team-b) and vera (a viewer)."""
    data_dir = tmp_path_factory.mktemp("corral-ws")
    server = start_server(data_dir)
    try:
        with server.api() as api:
            for project in ("team-a", "team-b"):
                answer = api.post("/queues", json={"name": project, "deserved": 1})
                assert answer.status_code == 201, answer.text
            for name, body in (
                ("alice", {"role": "member", "project": "team-a"}),
                ("mia", {"role": "member", "project": "team-a"}),
                ("bob", {"role": "member", "project": "team-b"}),
                ("vera", {"role": "viewer"}),
            ):
                answer = api.post("/users", json={"name": name, **body, "unix_user": "nobody"})
                assert answer.status_code == 201, answer.text
                server.tokens[name] = answer.json()["token"]
            answer = api.put("/users/alice/projects/team-a", json={"role": "project-admin"})
            assert answer.status_code == 200, answer.text
        yield server
    finally:
        stop_server(server.process, data_dir)


@pytest.fixture(scope="module")
def notebook(corral: Server) -> str:
    """`corral workspace create nb -p team-a -g 0.5 --jupyter`, answering through the proxy."""
    done = corral.cli("workspace", "create", "nb", "-p", "team-a", "-g", "0.5", "--jupyter")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{corral.url}/w/team-a/nb/" in done.stdout, done.stdout
    return "nb"
