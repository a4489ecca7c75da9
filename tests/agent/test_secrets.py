"""Project secrets on a real `corral up`: a task gets the value in its environment, and
the value is nowhere else: in no answer of the API or the dashboard, in no file of the
data directory (the database, its WAL, the server's log), and in no other project's reach.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from livecorral import CORRAL, PYTHON, CorralUp

from corral.dashboard.routes import COOKIE, PAGE_PATHS

PRINT_DIGEST = (
    "import hashlib, os; "
    "print('digest', hashlib.sha256(os.environ['API_KEY'].encode()).hexdigest(), "
    "os.environ['TOKEN'] == os.environ['API_KEY'], flush=True)"
)


def _user(up: CorralUp, name: str, project: str | None = None) -> httpx.Client:
    body: dict[str, Any] = {"name": name, "role": "member" if project else "viewer"}
    if project:
        body["project"] = project
    if os.geteuid() == 0:
        # A root agent runs a task as its submitter's Unix account, which must exist.
        body["unix_user"] = "nobody"
    token = up.post("/users", body)["token"]
    return httpx.Client(
        base_url=f"{up.url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _every_answer(up: CorralUp, client: httpx.Client, workload: str, project: str) -> str:
    """Every GET of the OpenAPI document (paths filled with the workload, its node and its
    project) and every dashboard page, as `client`'s user sees them, in one text."""
    document = client.get("/openapi.json").json()
    texts = []
    for path, operations in document["paths"].items():
        if "get" not in operations or not path.startswith("/api/v1"):
            continue
        url = path.removeprefix("/api/v1")
        url = url.replace("{project}", project)
        url = url.replace("{name}", up.node if url.startswith("/nodes/") else workload)
        url = url.replace("{name}", project) if url.startswith("/queues/") else url
        response = client.get(url)
        texts.append(f"{url} {response.status_code} {response.text}")
    token = client.headers["Authorization"].removeprefix("Bearer ")
    with httpx.Client(base_url=up.url, cookies={COOKIE: token}, timeout=30) as page:
        for path in (*PAGE_PATHS, f"/workloads/{workload}", f"/ui/api/workloads/{workload}"):
            texts.append(page.get(path).text)
    return "\n".join(texts)


def test_a_secret_reaches_its_task_and_nothing_else(corral_up: Any) -> None:
    up: CorralUp = corral_up(2, {"sec-a": 2, "sec-b": 2})
    alice, bob = _user(up, "alice", "sec-a"), _user(up, "bob", "sec-b")
    viewer = _user(up, "vera")
    value = "s3cr3t-" + secrets.token_hex(16)

    # Set by a member, from stdin, with the CLI: the value is not on the command line.
    env = {**os.environ, "CORRAL_SERVER": up.url}
    env["CORRAL_TOKEN"] = alice.headers["Authorization"].removeprefix("Bearer ")
    done = subprocess.run(
        [CORRAL, "secret", "set", "API_KEY", "-p", "sec-a"],
        input=value + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert value not in done.stdout + done.stderr
    listed = subprocess.run(
        [CORRAL, "secret", "list", "-p", "sec-a", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert "API_KEY" in listed.stdout and value not in listed.stdout

    # The key file is the owner's only.
    assert stat.S_IMODE((up.data_dir / "secret-key").stat().st_mode) == 0o600

    # Bob, of another project, can neither list, read, replace nor use it; nor can a viewer.
    assert bob.get("/projects/sec-a/secrets").status_code == 403
    assert viewer.get("/projects/sec-a/secrets").status_code == 403
    response = bob.put("/projects/sec-a/secrets/API_KEY", json={"value": "mine"})
    assert response.status_code == 403
    stolen = {"project": "sec-b", "tasks": [{"gpu": 0}], "secrets": {"API_KEY": "API_KEY"}}
    response = bob.post("/workloads", json={**stolen, "command": ["env"]})
    assert response.status_code == 422 and "secrets" in response.text, response.text
    response = bob.post("/workloads", json={**stolen, "project": "sec-a", "command": ["env"]})
    assert response.status_code == 403, response.text
    # A secret the project lacks, and a variable given twice, are refused at submit.
    missing = {"project": "sec-a", "tasks": [{"gpu": 0}], "secrets": {"X": "NOPE"}}
    response = alice.post("/workloads", json=missing)
    assert response.status_code == 422 and "NOPE" in response.text, response.text
    twice = {**missing, "secrets": {"X": "API_KEY"}, "env": {"X": "1"}}
    assert alice.post("/workloads", json=twice).status_code == 422

    # Alice's task gets it, in the variable of its name and in another one.
    body = {
        "name": "uses-secret",
        "project": "sec-a",
        "tasks": [{"gpu": 0}],
        # Under a root agent the task runs as nobody, who may not reach the venv's python.
        "command": ["/usr/bin/python3" if os.geteuid() == 0 else PYTHON, "-c", PRINT_DIGEST],
        "secrets": {"API_KEY": "API_KEY", "TOKEN": "API_KEY"},
    }
    response = alice.post("/workloads", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["secrets"] == {"API_KEY": "API_KEY", "TOKEN": "API_KEY"}
    up.wait_status("uses-secret", "succeeded")
    digest = hashlib.sha256(value.encode()).hexdigest()
    assert f"digest {digest} True" in up.log_text("uses-secret")

    # Nothing any of them can read shows it.
    for client in (alice, bob, viewer, up.client()):
        assert value not in _every_answer(up, client, "uses-secret", "sec-a")
    # Nor does any file of the data directory: database, WAL, logs, the task's output.
    for path in Path(up.data_dir).rglob("*"):
        if path.is_file() and path.name != "secret-key":
            assert value.encode() not in path.read_bytes(), path

    # Deleted, it is gone from the list, and new submissions naming it are refused.
    assert alice.delete("/projects/sec-a/secrets/API_KEY").status_code == 204
    assert alice.get("/projects/sec-a/secrets").json() == []
    assert alice.delete("/projects/sec-a/secrets/API_KEY").status_code == 404
    response = alice.post("/workloads", json={**body, "name": "too-late"})
    assert response.status_code == 422, response.text
    for client in (alice, bob, viewer):
        client.close()


KEY_OF = (
    "import sys; from pathlib import Path; from corral.store.secrets import load_key; "
    "print(load_key(Path(sys.argv[1])).decode())"
)


def _load_key(directory: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """`load_key(directory)` in a fresh process, with only the key variables given."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_SECRET")}
    return subprocess.run(
        [sys.executable, "-c", KEY_OF, str(directory)],
        capture_output=True,
        text=True,
        env={**environment, **variables},
    )


def test_the_key_file_is_made_private_and_kept(tmp_path: Path) -> None:
    """DATA_DIR/secret-key is written 0600 on the first start and read on the next; a
    named key file must exist (a new key would make every stored secret unreadable)."""
    first, again = _load_key(tmp_path).stdout, _load_key(tmp_path).stdout
    assert first == again and first.strip()
    assert stat.S_IMODE((tmp_path / "secret-key").stat().st_mode) == 0o600
    shared = tmp_path / "shared.key"
    shared.write_text(first)
    named = _load_key(tmp_path / "elsewhere", CORRAL_SECRET_KEY_FILE=str(shared))
    assert named.stdout == first
    given = _load_key(tmp_path / "elsewhere", CORRAL_SECRET_KEY=first.strip())
    assert given.stdout == first
    absent = _load_key(tmp_path, CORRAL_SECRET_KEY_FILE=str(tmp_path / "none"))
    assert absent.returncode != 0 and "FileNotFoundError" in absent.stderr
