"""A project's code snapshots through the API of a real application (SQLite and
PostgreSQL): uploaded once per tree and project, refused when the body is not what its
digest names or is a tarball crafted to escape where a node unpacks it, and out of reach
of other projects' members, who can neither learn that a tree is there nor start a task
in it by naming its digest."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.model import Queue, Resources
from corral.sdk.snapshot import pack
from corral.server.app import create_app
from corral.store import Store


@dataclass
class Clients:
    alice: TestClient  # a member of team-a
    bob: TestClient  # a member of team-b
    viewer: TestClient
    data_dir: Path


@pytest.fixture
def clients(store: Store, tmp_path: Path) -> Iterator[Clients]:
    for project in ("team-a", "team-b"):
        store.create_queue(Queue(project, deserved=Resources(gpu=4)))
    _, alice = store.create_user("alice", "member", "team-a")
    _, bob = store.create_user("bob", "member", "team-b")
    _, viewer = store.create_user("vera", "viewer", None)
    app = create_app(store, run_scheduler=False, data_dir=tmp_path)
    with TestClient(app) as base:
        assert base.get("/healthz").status_code == 200
        made = [
            TestClient(app, headers={"Authorization": f"Bearer {token}"})
            for token in (alice, bob, viewer)
        ]
        yield Clients(*made, data_dir=tmp_path)


def snapshot_of(tmp_path: Path) -> tuple[str, bytes]:
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "train.py").write_text("print('hello')\n")
    made = pack(tree)
    return made.digest, made.data


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def put(client: TestClient, project: str, digest: str, data: bytes) -> Any:
    return client.put(
        f"/api/v1/projects/{project}/code/{digest}",
        content=data,
        headers={"Content-Type": "application/octet-stream"},
    )


def submit(client: TestClient, project: str, code: str) -> Any:
    body = {"name": "train", "project": project, "tasks": [{"gpu": 1}], "command": ["true"]}
    return client.post("/api/v1/workloads", json={**body, "code": code})


def test_a_snapshot_is_uploaded_once_and_named_by_a_workload(
    clients: Clients, tmp_path: Path
) -> None:
    digest, data = snapshot_of(tmp_path)
    path = f"/api/v1/projects/team-a/code/{digest}"
    assert clients.alice.head(path).status_code == 404
    made = put(clients.alice, "team-a", digest, data)
    assert made.status_code == 201, made.text
    assert clients.alice.head(path).status_code == 200
    # The same tree again: nothing new is written.
    assert put(clients.alice, "team-a", digest, data).status_code == 200
    kept = list((clients.data_dir / "code" / "team-a").iterdir())
    assert [p.name for p in kept] == [f"{digest.removeprefix('sha256:')}.tar.gz"]
    assert kept[0].read_bytes() == data
    answer = submit(clients.alice, "team-a", digest)
    assert answer.status_code == 201, answer.text
    assert answer.json()["code"] == digest


def test_another_projects_snapshot_is_out_of_reach(clients: Clients, tmp_path: Path) -> None:
    digest, data = snapshot_of(tmp_path)
    assert put(clients.alice, "team-a", digest, data).status_code == 201
    # bob cannot ask team-a, upload to it, nor learn from his own project that team-a has it.
    for answer in (
        clients.bob.head(f"/api/v1/projects/team-a/code/{digest}"),
        put(clients.bob, "team-a", digest, data),
        put(clients.viewer, "team-a", digest, data),
    ):
        assert answer.status_code == 403, answer.text
    assert clients.bob.head(f"/api/v1/projects/team-b/code/{digest}").status_code == 404
    # Naming team-a's digest in his own project starts nothing of team-a's.
    refused = submit(clients.bob, "team-b", digest)
    assert refused.status_code == 422, refused.text
    assert "project team-b has no code snapshot" in refused.text
    # His own upload of the same tree is his project's own copy.
    assert put(clients.bob, "team-b", digest, data).status_code == 201
    assert submit(clients.bob, "team-b", digest).status_code == 201


def _tarball(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for info, content in members:
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return gzip.compress(raw.getvalue(), mtime=0)


def _file(name: str, content: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    return info, content


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info, None


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_tarball(_file("../escape.py")), id="dot-dot"),
        pytest.param(_tarball(_file("/etc/cron.d/evil")), id="absolute"),
        pytest.param(_tarball(_link("link", "/etc/shadow")), id="link-out"),
        pytest.param(b"not a tarball at all", id="not-gzip"),
    ],
)
def test_a_crafted_snapshot_is_refused_and_nothing_is_kept(clients: Clients, data: bytes) -> None:
    digest = digest_of(data)
    answer = put(clients.alice, "team-a", digest, data)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"][-1] == "body"
    assert clients.alice.head(f"/api/v1/projects/team-a/code/{digest}").status_code == 404
    assert list((clients.data_dir / "code" / "team-a").iterdir()) == []


def test_an_upload_must_be_what_its_digest_names(clients: Clients, tmp_path: Path) -> None:
    digest, data = snapshot_of(tmp_path)
    wrong = digest_of(b"something else")
    answer = put(clients.alice, "team-a", wrong, data)
    assert answer.status_code == 422, answer.text
    assert f"the upload's digest is {digest}, not {wrong}" in answer.text
    bad = clients.alice.put("/api/v1/projects/team-a/code/sha256:nothex", content=data)
    assert bad.status_code == 422, bad.text


def test_bad_fields_of_what_a_workload_brings_are_named(clients: Clients) -> None:
    body = {"project": "team-a", "tasks": [{"gpu": 1}], "command": ["python"]}
    for fields, where, says in (
        ({"code": "main"}, "code", "sha256"),
        ({"image": "--privileged"}, "image", "not an image reference"),
        ({"python": {"requirements": {"setup.py": ""}}}, "requirements", "give requirements.txt"),
        (
            {"python": {"requirements": {"requirements.txt": "x"}, "find_links": ["/srv/w"]}},
            "find_links",
            "pattern",
        ),
        (
            {"python": {"requirements": {"requirements.txt": "x"}, "version": "latest"}},
            "version",
            "pattern",
        ),
    ):
        answer = clients.alice.post("/api/v1/workloads", json={**body, **fields})
        assert answer.status_code == 422, (fields, answer.text)
        problem = answer.json()["detail"][0]
        assert where in [str(part) for part in problem["loc"]], (fields, problem)
        assert says in problem["msg"], (fields, problem)
