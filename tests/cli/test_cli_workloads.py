"""`corral submit`, `apply -f`, `list`, `describe`, `why`, `suspend`, `resume`, `delete`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from cli_support import Cli, make, row, wait_for

GIB = 1 << 30


def _status(api: httpx.Client, name: str, status: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        workload: dict[str, Any] = api.get(f"/workloads/{name}").json()
        return workload if workload["status"] == status else None

    return wait_for(probe, f"{name} to be {status}")


def _field(described: str, key: str) -> str:
    """The value beside `key` at the top of `corral describe`."""
    for line in described.splitlines():
        if line.startswith(key + " "):
            return line[len(key) :].strip()
    raise AssertionError(f"no {key!r} in:\n{described}")


def test_submit_sends_every_option(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "opt"})
    out = admin.ok(
        "submit", "opt-gang", "-p", "opt", "-g", "2", "--cpu", "4", "--memory", "16GiB",
        "--workers", "3", "--min-workers", "2", "--priority", "inference", "--non-preemptible",
        "-e", "A=1", "-e", "B=x=y", "--workdir", "/srv/run", "--max-runtime", "4h",
        "--node-selector", "pool=nowhere", "--node-selector", "zone=z1",
        "--node-selector", "zone=z2", "--topology-preferred", "rack", "--export", "NONE",
        "--grace-period", "2m", "--backoff-limit", "3",
        "--", "python", "train.py", "-p", "x", "--gpu", "3", "--", "tail",
    )  # fmt: skip
    assert out == "Submitted opt-gang to opt (pending).\n"
    gang = api.get("/workloads/opt-gang").json()
    assert gang["tasks"] == [
        {"name": "worker", "replicas": 3, "gpu": 2, "gpu_memory": 0, "cpu": 4, "memory": 16 * GIB}
    ]
    assert gang["min_available"] == 2
    assert (gang["priority"], gang["preemptible"]) == (125, False)
    assert gang["env"] == {"A": "1", "B": "x=y"}
    assert gang["workdir"] == "/srv/run"
    assert gang["max_runtime"] == 4 * 3600
    assert gang["node_selector"] == {"pool": ["nowhere"], "zone": ["z1", "z2"]}
    assert gang["topology"] == {"key": "rack", "required": False}
    assert (gang["grace_period"], gang["backoff_limit"]) == (120, 3)
    # Everything after the first "--" is the command, options and "--" included.
    assert gang["command"] == ["python", "train.py", "-p", "x", "--gpu", "3", "--", "tail"]

    out = admin.ok(
        "submit", "-p", "opt", "--gpu-memory", "20GiB", "--interactive", "--topology", "rack",
        "--node-selector", "pool=nowhere", "--", "sleep", "1",
    )  # fmt: skip
    name = out.split()[1]
    assert name.startswith("opt-") and out == f"Submitted {name} to opt (pending).\n"
    fraction = api.get(f"/workloads/{name}").json()
    assert fraction["tasks"][0]["gpu_memory"] == 20 * GIB
    assert fraction["tasks"][0]["gpu"] == 0
    assert (fraction["priority"], fraction["preemptible"]) == (100, False)
    assert fraction["topology"] == {"key": "rack", "required": True}
    assert fraction["min_available"] is None

    admin.ok("submit", "opt-75", "-p", "opt", "-g", "0.5", "--priority", "75", "--preemptible",
             "--node-selector", "pool=nowhere", "--", "true")  # fmt: skip
    small = api.get("/workloads/opt-75").json()
    assert (small["priority"], small["preemptible"], small["tasks"][0]["gpu"]) == (75, True, 0.5)


def test_submit_refuses_bad_options_and_sends_nothing(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "badopt"})
    make(api, "/queues", {"name": "badopt-dept"})
    make(api, "/queues", {"name": "badopt-child", "parent": "badopt-dept"})
    cases = [
        (["-g", "abc"], "-g/--gpu: 'abc' is not a number of GPUs"),
        (["-g", "1.5"], "-g/--gpu: '1.5': 1 GPU or more must be a whole number"),
        (["-g", "0.5", "--gpu-memory", "1GiB"], "give -g/--gpu or --gpu-memory, not both"),
        (["--priority", "urgent"], "--priority: 'urgent' is not a priority class"),
        (["--workers", "2", "--min-workers", "3"], "--min-workers: 3 is more than the 2"),
        (["-e", "NOVALUE"], "-e/--env: 'NOVALUE' is not KEY=VALUE"),
        # Checked by the server, which names the field.
        (["--max-runtime", "4x"], "max_runtime: '4x' is not a duration"),
        (["-e", "1X=2"], "env.1X: String should match pattern"),
    ]
    for args, message in cases:
        line = admin.fails("submit", "-p", "badopt", *args, "--", "true", code=2)
        assert line.startswith(message), (args, line)
    assert admin.fails("submit", "-p", "badopt", "-g", "1", code=2) == (
        "give the command to run after --, e.g. -- python train.py"
    )
    assert admin.fails("submit", "-p", "badopt-dept", "--", "true", code=2) == (
        "project: 'badopt-dept' is a department; submit to a project"
    )
    assert api.get("/workloads", params={"project": "badopt"}).json() == []


def test_apply_submits_each_document(admin: Cli, api: httpx.Client, tmp_path: Path) -> None:
    make(api, "/queues", {"name": "ap"})
    make(api, "/queues", {"name": "ap-other"})
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        """
name: ap-one
tasks: [{replicas: 2, gpu: 0.5, memory: 4GiB}]
command: [python, train.py]
priority: inference
node_selector: {pool: nowhere}
---
name: ap-two
project: ap-other
tasks: [{name: ps, gpu: 0}, {name: worker, replicas: 2, gpu: 1}]
min_available: 2
env: {EPOCHS: "3"}
max_runtime: 90m
node_selector: {pool: [nowhere, elsewhere]}
topology: {key: rack}
command: [sleep, "1"]
"""
    )
    out = admin.ok("apply", "-f", str(jobs), "-p", "ap")
    assert out == "Submitted ap-one to ap (pending).\nSubmitted ap-two to ap-other (pending).\n"
    one = api.get("/workloads/ap-one").json()
    assert one["project"] == "ap" and one["priority"] == 125
    assert one["tasks"] == [
        {"name": "worker", "replicas": 2, "gpu": 0.5, "gpu_memory": 0, "cpu": 0, "memory": 4 * GIB}
    ]
    two = api.get("/workloads/ap-two").json()
    assert [(t["name"], t["replicas"], t["gpu"]) for t in two["tasks"]] == [
        ("ps", 1, 0),
        ("worker", 2, 1),
    ]
    assert two["min_available"] == 2 and two["env"] == {"EPOCHS": "3"}
    assert two["max_runtime"] == 5400
    assert two["node_selector"] == {"pool": ["nowhere", "elsewhere"]}
    assert two["topology"] == {"key": "rack", "required": True}
    # From standard input.
    stdin = "{name: ap-three, project: ap, tasks: [{gpu: 1}], node_selector: {pool: nowhere}}"
    assert admin.ok("apply", "-f", "-", stdin=stdin) == "Submitted ap-three to ap (pending).\n"


def test_apply_names_the_document_and_field_that_is_wrong(
    admin: Cli, api: httpx.Client, tmp_path: Path
) -> None:
    make(api, "/queues", {"name": "apx"})
    path = tmp_path / "bad.yaml"
    path.write_text(
        "{name: apx-ok, tasks: [{gpu: 1}], node_selector: {pool: nowhere}}\n---\n"
        "{name: apx-bad, tasks: [{gpu: 1.5}]}\n"
    )
    # All the documents, or none: a bad one stops the good ones before it too.
    refused = admin.run("apply", "-f", str(path), "-p", "apx")
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr == (
        f"{path}, document 2 (apx-bad): tasks[0].gpu: a GPU request of 1 or more must be a "
        "whole number of devices (nothing was submitted)\n"
    )
    assert api.get("/workloads/apx-ok").status_code == 404
    # Checks the store makes name the document too: an unknown project, a name taken.
    path.write_text(
        "{name: apx-ok, tasks: [{gpu: 1}], node_selector: {pool: nowhere}}\n---\n"
        "{name: apx-two, project: nowhere, tasks: [{gpu: 1}]}\n"
    )
    assert admin.fails("apply", "-f", str(path), "-p", "apx", code=2) == (
        f"{path}, document 2 (apx-two): project: unknown queue 'nowhere' (nothing was submitted)"
    )
    admin.ok("submit", "apx-two", "-p", "apx", "-g", "1", "--node-selector", "pool=x", "--", "true")
    path.write_text(
        "{name: apx-ok, tasks: [{gpu: 1}], node_selector: {pool: nowhere}}\n---\n"
        "{name: apx-two, tasks: [{gpu: 1}]}\n"
    )
    assert admin.fails("apply", "-f", str(path), "-p", "apx", code=1) == (
        f"{path}: workload 'apx-two' already exists in apx (nothing was submitted)"
    )
    assert api.get("/workloads/apx-ok").status_code == 404
    for text, message in [
        ("tasks: [{gpu: 1}]\ncolour: red\n", "colour: Extra inputs are not permitted"),
        # A field of several shapes reports the shape that was meant, by its plain path.
        ("tasks: [{gpu: 1}]\npriority: 1.5\n", "priority: Input should be a valid integer"),
        ("tasks: [{gpu: 1, replicas: 0}]\n", "tasks[0].replicas: Input should be greater"),
        ("name: [\n", "line 2, column 1: expected the node content"),
    ]:
        line = admin.fails("apply", "-f", "-", "-p", "apx", code=2, stdin=text)
        assert line.startswith(f"<stdin>: {message}"), (text, line)
        assert ".str" not in line and ".int" not in line
    assert admin.fails("apply", "-f", str(tmp_path / "none.yaml"), code=2).startswith(
        f"{tmp_path / 'none.yaml'}: cannot read it"
    )
    assert [w["name"] for w in api.get("/workloads", params={"project": "apx"}).json()] == [
        "apx-two"
    ]


def test_list_describe_and_why(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "lw", "deserved": 4})
    make(api, "/nodes", {"name": "lw-node", "gpus": 4, "labels": {"pool": "lw"}})
    pool = ("--node-selector", "pool=lw")
    admin.ok("submit", "lw-big", "-p", "lw", "-g", "4", *pool, "-e", "K=V", "--export", "NONE",
             "--", "sleep", "9")  # fmt: skip
    _status(api, "lw-big", "running")
    admin.ok("submit", "lw-next", "-p", "lw", "-g", "2", *pool, "--", "true")
    admin.ok("submit", "lw-last", "-p", "lw", "-g", "1", *pool, "--", "true")
    waiting = wait_for(
        lambda: api.get("/workloads/lw-last").json()["reason"], "a reason for lw-last"
    )

    listed = admin.ok("list", "-p", "lw")
    assert row(listed, "lw-big")[1:7] == ["lw", "admin", "running", "1/1", "4", "train (50)"]
    assert row(listed, "lw-big")[8] == "lw-node"
    assert row(listed, "lw-last")[3:5] == ["pending", "0/1"]
    assert row(listed, "lw-last")[9] == waiting
    pending = admin.ok("list", "-p", "lw", "--status", "pending")
    assert "lw-next" in pending and "lw-big" not in pending
    assert admin.json("list", "-p", "lw") == api.get("/workloads?project=lw").json()

    described = admin.ok("describe", "lw-big")
    assert _field(described, "status") == "running"
    assert _field(described, "command") == "sleep 9"
    assert _field(described, "env") == "K=V"
    assert _field(described, "priority") == "train (50), preemptible"
    assert "Placement" in described and "bound" in described
    assert row(described, "0")[1:] == ["lw-node", "0,1,2,3", "4"]
    bound = api.get("/workloads/lw-big/events").json()[1]
    assert admin.json("describe", "lw-big") == {
        "workload": api.get("/workloads/lw-big").json(),
        "attempts": [
            {
                "number": 1,
                "started": bound["time"],
                "ended": None,
                "nodes": ["lw-node"],
                "outcome": "running",
                "cause": "",
            }
        ],
        "events": api.get("/workloads/lw-big/events").json(),
    }

    why = admin.ok("why", "lw-last")
    lines = why.splitlines()
    assert lines[0] == f"lw-last is pending: {waiting}"
    assert lines[1] == "It is number 2 in lw's queue, after lw-next."
    assert row(why, "lw-big")[1:] == [
        "lw", "train (50)", "yes", "lw-node", "4", "no: same project, and its priority is not lower"
    ]  # fmt: skip
    assert admin.ok("why", "lw-next").splitlines()[1] == (
        "It is the next of lw's pending workloads to be tried."
    )
    assert admin.json("why", "lw-last") == api.get("/workloads/lw-last/why").json()


def test_describe_lists_every_attempt_with_its_cause(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "at", "deserved": 1})
    node = {"name": "at-node", "gpus": 1, "labels": {"pool": "at"}}
    make(api, "/nodes", node)
    pool = ("--node-selector", "pool=at")
    admin.ok("submit", "at-job", "-p", "at", "-g", "1", "--backoff-limit", "2", *pool, "--", "x")
    # 1: its node is removed. 2: preempted by higher-priority work of its project.
    # 3: suspended while it runs.
    _status(api, "at-job", "running")
    assert api.delete("/nodes/at-node").status_code == 204
    _status(api, "at-job", "pending")
    make(api, "/nodes", node)
    _status(api, "at-job", "running")
    admin.ok("submit", "at-high", "-p", "at", "-g", "1", "--priority", "inference", *pool,
             "--", "x")  # fmt: skip
    _status(api, "at-high", "running")
    admin.ok("cancel", "at-high")
    _status(api, "at-job", "running")
    admin.ok("suspend", "at-job")

    described = admin.ok("describe", "at-job")
    assert _field(described, "attempts") == "3"
    assert _field(described, "retries") == (
        "0 of 2 used (only its own failures count; requeues after a lost or fenced node "
        "and preemptions do not)"
    )
    assert row(described, "1")[3:] == ["at-node", "requeued", "node at-node was removed"]
    preempted = row(described, "2")
    assert preempted[3:5] == ["at-node", "preempted"]
    assert preempted[5].startswith("preempted: preempt for at/at-high")
    assert row(described, "3")[3:] == ["at-node", "suspended", "by admin"]
    attempts = admin.json("describe", "at-job")["attempts"]
    assert [(a["number"], a["outcome"]) for a in attempts] == [
        (1, "requeued"),
        (2, "preempted"),
        (3, "suspended"),
    ]
    assert all(a["started"] <= a["ended"] for a in attempts)


def test_suspend_resume_and_delete(admin: Cli, api: httpx.Client) -> None:
    make(api, "/queues", {"name": "sr"})
    make(api, "/nodes", {"name": "sr-node", "gpus": 1, "labels": {"pool": "sr"}})
    admin.ok("submit", "sr-job", "-p", "sr", "-g", "1", "--node-selector", "pool=sr", "--", "x")
    _status(api, "sr-job", "running")
    assert admin.ok("suspend", "sr-job") == "Suspended sr-job.\n"
    assert api.get("/workloads/sr-job").json()["status"] == "suspended"
    assert admin.ok("resume", "sr-job").startswith("Resumed sr-job (")
    _status(api, "sr-job", "running")
    assert admin.fails("resume", "sr-job", code=1) == (
        "workload 'sr/sr-job' is running, not suspended"
    )
    assert admin.ok("delete", "sr-job") == "Deleted sr-job.\n"
    assert api.get("/workloads/sr-job").status_code == 404
    assert admin.fails("delete", "sr-job", code=1) == "workload 'sr-job' not found"


def test_secrets_from_the_cli(admin: Cli, api: httpx.Client, tmp_path: Path) -> None:
    """`corral secret set` reads stdin or a file, `list` shows names only, and submit's
    `--secret NAME` / `--secret VAR=NAME` and YAML's `secrets:` list name them."""
    make(api, "/queues", {"name": "sk"})
    admin.ok("secret", "set", "API_KEY", "-p", "sk", stdin="from-stdin-value\n")
    key_file = tmp_path / "hf"
    key_file.write_text("from-file-value\n")
    admin.ok("secret", "set", "HF", "-p", "sk", "--from-file", str(key_file))
    listed = admin.ok("secret", "list", "-p", "sk")
    assert "API_KEY" in listed and "HF" in listed and "value" not in listed
    assert admin.fails("secret", "set", "EMPTY", "-p", "sk", stdin="", code=2) == (
        "the secret is empty"
    )
    args = ["--secret", "API_KEY", "--secret", "HF_TOKEN=HF", "--", "true"]
    admin.ok("submit", "sk-cli", "-p", "sk", "-g", "0", *args)
    assert api.get("/workloads/sk-cli").json()["secrets"] == {
        "API_KEY": "API_KEY",
        "HF_TOKEN": "HF",
    }
    assert admin.fails("submit", "-p", "sk", "--secret", "A=", "--", "true", code=2) == (
        "--secret: 'A=' is not NAME or VARIABLE=NAME"
    )
    stdin = "{name: sk-yaml, project: sk, tasks: [{gpu: 0}], secrets: [API_KEY, TOKEN=HF]}"
    assert admin.ok("apply", "-f", "-", stdin=stdin) == "Submitted sk-yaml to sk (pending).\n"
    assert api.get("/workloads/sk-yaml").json()["secrets"] == {"API_KEY": "API_KEY", "TOKEN": "HF"}
    described = admin.ok("describe", "sk-yaml") + admin.ok("describe", "sk-cli")
    assert "from-stdin-value" not in described and "from-file-value" not in described
    assert "TOKEN <- secret HF" in described
    admin.ok("secret", "delete", "HF", "-p", "sk")
    assert [s["name"] for s in api.get("/projects/sk/secrets").json()] == ["API_KEY"]


def test_a_name_in_two_projects_is_told_apart_by_its_project(admin: Cli, api: httpx.Client) -> None:
    """A name is unique within its project: the CLI takes PROJECT/NAME or `-p PROJECT`,
    and a name the admin reads in two projects is refused with both named."""
    for project in ("twin-a", "twin-b"):
        make(api, "/queues", {"name": project})
        admin.ok("submit", "twin", "-p", project, "-g", "0", "--", "true")
    both = admin.fails("describe", "twin", code=1)
    assert "twin-a/twin" in both and "twin-b/twin" in both and "give its project" in both
    described = admin.json("describe", "twin-b/twin")["workload"]
    assert (described["project"], described["name"]) == ("twin-b", "twin")
    assert admin.json("describe", "twin", "-p", "twin-a")["workload"]["project"] == "twin-a"
    assert "--project" in admin.fails("describe", "twin-a/twin", "-p", "twin-b", code=2)
    assert admin.ok("delete", "twin", "-p", "twin-a") == "Deleted twin-a/twin.\n"
    assert admin.json("describe", "twin")["workload"]["project"] == "twin-b"
