"""The list commands' `-o wide|json|yaml`, output to a pipe not cut to 80 columns, and the
help that points the way: the closest command for a mistyped one, `delete` naming
`cancel`."""

from __future__ import annotations

import subprocess

import httpx
import yaml
from cli_support import CORRAL, Cli, make, row, wait_for


def _setup(api: httpx.Client) -> None:
    if api.get("/queues/out-team").status_code == 200:
        return
    make(api, "/queues", {"name": "out-team", "deserved": 2})
    make(api, "/nodes", {"name": "out-node", "gpus": 2, "labels": {"pool": "out"}})


def test_list_commands_print_wide_json_and_yaml(admin: Cli, api: httpx.Client) -> None:
    _setup(api)
    admin.ok(
        "submit", "out-job", "-p", "out-team", "-g", "1", "--node-selector", "pool=out",
        "--export", "NONE", "--workdir", "/srv/out", "--max-runtime", "2h",
        "--", "sleep", "30 s",
    )  # fmt: skip
    wait_for(lambda: api.get("/workloads/out-job").json()["status"] == "running", "out-job")
    wide = admin.ok("list", "-p", "out-team", "-o", "wide")
    assert row(wide, "out-job")[-5:] == ["yes", "1", "2h", "/srv/out", "sleep '30 s'"]
    listed = api.get("/workloads", params={"project": "out-team"}).json()
    assert yaml.safe_load(admin.ok("list", "-p", "out-team", "-o", "yaml")) == listed
    assert admin.json("list", "-p", "out-team") == listed
    nodes = api.get("/nodes").json()
    assert yaml.safe_load(admin.ok("nodes", "-o", "yaml")) == nodes
    virtual = next(node["virtual"] for node in nodes if node["name"] == "out-node")
    assert row(admin.ok("nodes", "-o", "wide"), "out-node")[-3] == ("yes" if virtual else "no")
    queues = api.get("/queues").json()
    assert yaml.safe_load(admin.ok("queues", "-o", "json")) == queues
    assert row(admin.ok("queues", "-o", "wide"), "out-team")[-4:-2] == ["1", "100"]
    assert admin.fails("queues", "-o", "xml", code=2) == (
        "-o/--output: 'xml' is not one of table, wide, json, yaml"
    )


def test_account_lists_print_json_and_yaml_too(admin: Cli, api: httpx.Client) -> None:
    _setup(api)
    secret = admin.run("secret", "set", "OUT_KEY", "-p", "out-team", stdin="hidden")
    assert secret.returncode == 0, secret.stderr
    assert yaml.safe_load(admin.ok("user", "list", "-o", "yaml")) == api.get("/users").json()
    tokens = yaml.safe_load(admin.ok("token", "list", "-o", "yaml"))
    assert [t["id"] for t in tokens] == [t["id"] for t in api.get("/tokens").json()]
    secrets = yaml.safe_load(admin.ok("secret", "list", "-p", "out-team", "-o", "json"))
    assert [s["name"] for s in secrets] == ["OUT_KEY"] and "hidden" not in str(secrets)
    audit = yaml.safe_load(admin.ok("audit", "--limit", "3", "-o", "yaml"))
    assert len(audit) == 3 and {"method", "route", "status"} <= set(audit[0])
    for command in (("user", "list"), ("token", "list"), ("audit",)):
        assert admin.fails(*command, "-o", "xml", code=2) == (
            "-o/--output: 'xml' is not one of table, wide, json, yaml"
        )


def test_submit_declares_ports(admin: Cli, api: httpx.Client) -> None:
    _setup(api)
    args = ("submit", "web", "-p", "out-team", "--export", "NONE", "--dry-run")
    printed = admin.ok(*args, "--port", "main", "--port", "metrics", "--", "true")
    assert yaml.safe_load(printed)["ports"] == [{"name": "main"}, {"name": "metrics"}]
    assert admin.fails(*args, "--port", "Main", "--", "true", code=2).startswith(
        "--port: 'Main': lowercase letters"
    )
    assert admin.fails(*args, "--port", "a", "--port", "a", "--", "true", code=2) == (
        "--port: 'a' given twice"
    )


def test_piped_output_is_not_cut_to_80_columns(admin: Cli, api: httpx.Client) -> None:
    _setup(api)
    long_name = "out-" + "x" * 50
    admin.ok("submit", long_name, "-p", "out-team", "-g", "2", "--node-selector", "pool=none",
             "--export", "NONE", "--", "true")  # fmt: skip
    env = {k: v for k, v in admin.env().items() if k != "COLUMNS"}
    done = subprocess.run(
        [str(CORRAL), "list", "-p", "out-team", "-o", "wide"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    # Every cell on one line, whole: the row is far wider than 80 columns.
    cells = row(done.stdout, long_name)
    assert cells[3] == "pending" and cells[-1] == "true"
    assert max(len(line) for line in done.stdout.splitlines()) > 120


def test_a_mistyped_command_is_told_the_closest_and_delete_names_cancel(tmp_path: object) -> None:
    done = subprocess.run([str(CORRAL), "lsit"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "No such command 'lsit'. Did you mean 'list'" in done.stderr
    helped = subprocess.run(
        [str(CORRAL), "delete", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "corral cancel" in " ".join(helped.stdout.split())
