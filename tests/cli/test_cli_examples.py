"""The workload format end to end: every file of examples/workloads/ is taken by
`corral apply -f`, `corral submit --dry-run` prints what `apply -f` takes back, and
`--export` sends the shell's variables less what must not be stored."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from cli_support import Cli, make

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"


def _setup(admin: Cli, api: httpx.Client) -> None:
    if api.get("/queues/team-a").status_code == 200:
        return
    make(api, "/queues", {"name": "research", "deserved": 4})
    make(api, "/queues", {"name": "team-a", "parent": "research", "deserved": 2, "limit": 6})
    admin.ok("secret", "set", "HF_TOKEN", "-p", "team-a", stdin="hf-value\n")


def test_every_example_is_taken(admin: Cli, api: httpx.Client) -> None:
    _setup(admin, api)
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert {f.stem for f in files} >= {"train", "gang", "elastic", "fraction", "interactive"}
    for file in files:
        documents = [d for d in yaml.safe_load_all(file.read_text()) if d]
        out = admin.ok("apply", "-f", str(file))
        assert out.splitlines() == [
            f"Submitted {d['name']} to team-a (pending)." for d in documents
        ], file
    gang = api.get("/workloads/gang-example").json()
    assert gang["topology"] == {"key": "rack", "required": False}
    assert gang["tasks"][0]["replicas"] == 2
    assert api.get("/workloads/train-example").json()["grace_period"] == 30
    assert api.get("/workloads/notebook-example").json()["preemptible"] is False
    assert api.get("/workloads/inference-example").json()["secrets"] == {"HF_TOKEN": "HF_TOKEN"}


def test_dry_run_prints_what_apply_takes(admin: Cli, api: httpx.Client) -> None:
    _setup(admin, api)
    args = (
        "submit", "round-trip", "-p", "team-a", "-g", "2", "--workers", "2", "--task-group",
        "trainer", "--grace-period", "1m", "--backoff-limit", "1", "--max-runtime", "2h",
        "-e", "A=1", "--export", "NONE", "--workdir", "/srv/run", "--dry-run",
        "--", "python", "x.py", "--dry-run",
    )  # fmt: skip
    printed = admin.ok(*args)
    assert api.get("/workloads/round-trip").status_code == 404  # nothing was sent
    assert yaml.safe_load(printed) == {
        "name": "round-trip",
        "project": "team-a",
        "tasks": [{"replicas": 2, "gpu": 2.0, "name": "trainer"}],
        "command": ["python", "x.py", "--dry-run"],
        "env": {"A": "1"},
        "workdir": "/srv/run",
        "grace_period": "1m",
        "backoff_limit": 1,
        "max_runtime": "2h",
    }
    assert admin.ok("apply", "-f", "-", stdin=printed) == (
        "Submitted round-trip to team-a (pending).\n"
    )
    stored = api.get("/workloads/round-trip").json()
    assert (stored["grace_period"], stored["backoff_limit"], stored["max_runtime"]) == (
        60,
        1,
        7200,
    )
    assert stored["tasks"][0]["name"] == "trainer" and stored["env"] == {"A": "1"}
    as_json = admin.ok(*args[:-4], "-o", "json", "--", "true")
    assert '"name": "round-trip"' in as_json
    assert admin.fails(*args[:-4], "-o", "xml", "--", "true", code=2) == (
        "-o/--output: 'xml' is not yaml or json"
    )


def test_export_sends_the_shell_less_secrets_and_corral_s_own(admin: Cli, tmp_path: Path) -> None:
    shell = {"MY_API_TOKEN": "s3cret", "PLAIN_SETTING": "on", "SSH_AUTH_SOCK": "/tmp/agent"}

    def dry(*more: str) -> dict[str, object]:
        done = admin.run(
            "submit", "-p", "team-a", "--dry-run", *more, "--", "true", env=shell
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        document: dict[str, object] = yaml.safe_load(done.stdout)
        return document

    everything = dry()
    env = everything["env"]
    assert isinstance(env, dict)
    assert env["PLAIN_SETTING"] == "on" and "PATH" in env
    for left_out in ("MY_API_TOKEN", "SSH_AUTH_SOCK", "CORRAL_TOKEN", "CORRAL_SERVER", "HOME"):
        assert left_out not in env
    assert everything["workdir"] == str(Path.cwd())
    named = dry("--export", "MY_API_TOKEN,PLAIN_SETTING")["env"]
    assert named == {"MY_API_TOKEN": "s3cret", "PLAIN_SETTING": "on"}
    assert "env" not in dry("--export", "NONE")
    assert dry("--export", "NONE", "--workdir", ".")["workdir"] == "."
    for bad, message in (
        ("CORRAL_TOKEN", "--export: CORRAL_TOKEN is corral's own and is never exported"),
        ("NOT_SET_HERE", "--export: NOT_SET_HERE is not set in this shell"),
        ("A=B", "--export: 'A=B' is not a variable name (give ALL, NONE or NAME,NAME,...)"),
    ):
        done = admin.run("submit", "-p", "team-a", "--export", bad, "--", "true", env=shell)
        assert (done.returncode, done.stderr.strip()) == (2, message)
