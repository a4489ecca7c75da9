"""Hostile YAML: `corral plan`, `corral simulate` and `corral apply` read it within bounds
(corral.scenario.yamlio) and answer exit 2 with one line naming the file and the problem;
never a traceback, a hang or hundreds of MB. And the bounds stop only hostile files: a
cluster of thousands of nodes, written out or with anchors, is planned."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from corral.cli.main import app
from corral.scenario import ScenarioError, parse_scenario, yamlio
from corral.scenario.yamlio import (
    MAX_ALIAS_VALUES,
    MAX_BYTES,
    MAX_DEPTH,
    BoundedLoader,
    YamlLimitError,
    read_text,
)

CORRAL = Path(sys.executable).with_name("corral")


def _laughs(levels: int = 9) -> str:
    """The "billion laughs": each level an anchored list of nine aliases of the last."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        aliases = ",".join([f"*l{level - 1}"] * 9)
        lines.append(f"l{level}: &l{level} [{aliases}]")
    return "\n".join(lines) + "\n"


def _wide_bomb() -> str:
    """Aliases of one long anchored list, up to the byte limit: each adds 1000 values."""
    head = "big: &big [" + ",".join(["0"] * 999) + "]\ncopies:\n"
    return head + "- *big\n" * ((MAX_BYTES - len(head)) // len("- *big\n"))


BOMB = f"aliases expand the file by more than {MAX_ALIAS_VALUES} values (an alias bomb)"

# name -> (text, words the one-line message must hold)
HOSTILE = {
    "billion-laughs": (_laughs(), BOMB),
    "wide-bomb": (_wide_bomb(), BOMB),
    "deep-flow": ("[" * 100_000 + "]" * 100_000, f"nested more than {MAX_DEPTH} levels"),
    "deep-block": ("".join(" " * i + "a:\n" for i in range(200)), "nested more than"),
    "self-reference": ("nodes: &a [*a]\n", "refers to a node that contains it"),
    # Aliases of a list of nine add ten values each, and add up past the bound.
    "many-aliases": (
        "x: &x [1,2,3,4,5,6,7,8,9]\ny: [" + ",".join(["*x"] * (MAX_ALIAS_VALUES // 10 + 1)) + "]\n",
        BOMB,
    ),
    "too-large": ("# " + "x" * MAX_BYTES + "\n", "larger than 2 MiB"),
    "bad-date": ("name: 2001-13-45\n", "month must be in 1..12"),
    "huge-integer": ("nodes: [{name: a, gpus: " + "9" * 5000 + "}]\n", "cannot read"),
}


def _load(text: str) -> object:
    return yaml.load(text, Loader=BoundedLoader)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_file_is_refused_quickly(name: str) -> None:
    text, words = HOSTILE[name]
    started = time.monotonic()
    with pytest.raises(yaml.YAMLError) as raised:
        _load(text)
    assert words in str(raised.value)
    # The unbounded loader never finishes a billion laughs; bounded, the slowest case
    # (deep-flow: 100,000 brackets scanned in pure Python) takes a few seconds.
    assert time.monotonic() - started < 30


def test_within_the_bounds_aliases_merges_and_documents_load() -> None:
    text = "base: &b {gpu: 1, cpu: 2}\nuse: *b\nmerged:\n  <<: *b\n  cpu: 4\n"
    assert _load(text) == {
        "base": {"gpu": 1, "cpu": 2},
        "use": {"gpu": 1, "cpu": 2},
        "merged": {"gpu": 1, "cpu": 4},
    }
    assert _load("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    # Anchors are per document: the same name in the next one is a fresh anchor.
    stream = "a: &x 1\n---\nb: &x [2]\nc: *x\n"
    assert list(yaml.load_all(stream, Loader=BoundedLoader)) == [{"a": 1}, {"b": [2], "c": [2]}]


def test_an_anchor_reused_in_a_later_document_is_not_mistaken_for_a_cycle() -> None:
    stream = "".join(f"a{n}: &x [1, 2]\nb: *x\n---\n" for n in range(50))
    assert len([d for d in yaml.load_all(stream, Loader=BoundedLoader) if d]) == 50


def test_the_count_runs_over_the_whole_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamlio, "MAX_ALIAS_VALUES", 1000)
    # Each document's aliases add 100 values; together they pass the bound.
    document = "a: &a [" + ",".join(["1"] * 99) + "]\nb: *a\n---\n"
    loaded = yaml.load_all(document * 10, Loader=BoundedLoader)
    assert len([d for d in loaded if d is not None]) == 10
    with pytest.raises(YamlLimitError, match="by more than 1000 values"):
        list(yaml.load_all(document * 11, Loader=BoundedLoader))


def test_values_written_out_are_not_counted_however_many() -> None:
    values = MAX_ALIAS_VALUES + 1
    assert _load("[" + ",".join(["1"] * values) + "]\n") == [1] * values


def test_read_text_stops_at_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * MAX_BYTES)
    assert len(read_text(path)) == MAX_BYTES
    path.write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(YamlLimitError, match="larger than"):
        read_text(path)


def test_a_scenario_names_the_line_of_the_problem() -> None:
    with pytest.raises(ScenarioError) as raised:
        parse_scenario("name: s\nnodes: &n [{name: a, gpus: 1}, *n]\n", "S.yaml")
    message = str(raised.value)
    assert message.startswith("S.yaml: line 2, column "), message
    assert "refers to a node that contains it" in message


# (gpu_model, GPUs, GPU memory, cores, memory, labels): the mix of a large training cluster.
_MODELS = (
    *[("H100", 8, "80GiB", 128, "2TiB", "{pool: train, tier: large}")] * 6,
    *[("A100", 8, "40GiB", 96, "1TiB", "{pool: train, tier: medium}")] * 3,
    ("L4", 4, "24GiB", 48, "384GiB", "{pool: serve, tier: small}"),
)
_PROJECTS = 12
_INFERENCE = "{name: server, replicas: 2, gpu: 1, cpu: 8, memory: 64GiB}"


def _cluster(nodes: int, pending: int, *, anchors: bool = False) -> str:
    """A scenario of a real cluster's size: racks of 16 nodes of three GPU models, four
    departments of three projects, the first two thirds of the nodes busy with running
    workloads (whole-GPU jobs, two-node gangs) and `pending` more waiting (gangs, whole
    GPUs, fractions, inference groups with a model selector). With `anchors` the same
    cluster is written as a person would shorten it: each node's labels merge its model's
    anchored map, and every inference workload after the first aliases its task group."""
    rng = random.Random(7)
    lines = ["name: generated", "run: {cycles: until-stable}", "nodes:"]
    anchored: set[str] = set()
    for number in range(nodes):
        model, gpus, gpu_memory, cpu, memory, labels = _MODELS[number % len(_MODELS)]
        rack = f"rack: r{number // 16:03d}"
        if not anchors:
            labels = f"{labels[:-1]}, {rack}}}"
        elif model in anchored:
            labels = f"{{<<: *{model}, {rack}}}"
        else:
            anchored.add(model)
            labels = f"{{<<: &{model} {labels}, {rack}}}"
        lines.append(
            f"  - {{name: n{number:04d}, gpus: {gpus}, gpu_model: {model}, "
            f"gpu_memory: {gpu_memory}, cpu: {cpu}, memory: {memory}, labels: {labels}}}"
        )
    lines.append("queues:")
    lines.extend(f"  - {{name: d{d}, deserved: {nodes * 2}}}" for d in range(4))
    lines.extend(
        f"  - {{name: p{p:02d}, parent: d{p % 4}, deserved: {nodes * 2 // 3}, "
        f"over_quota_weight: {1 + p % 3}}}"
        for p in range(_PROJECTS)
    )
    lines.append("workloads:")

    def workload(*fields: str) -> None:
        name = f"w{len(lines):05d}"
        lines.append(f"  - name: {name}\n    queue: p{rng.randrange(_PROJECTS):02d}")
        lines.extend(f"    {field}" for field in fields)

    number = 0
    while number < nodes * 2 // 3:
        gpus = _MODELS[number % len(_MODELS)][1]
        # A gang of two nodes where this one and the next have 8 GPUs.
        if number % len(_MODELS) < 8 and rng.random() < 0.2:
            gang = f"nodes: [n{number:04d}, n{number + 1:04d}]"
            workload("priority: train", "tasks: 2x8", "status: running", gang)
            number += 2
            continue
        while gpus:
            size = rng.choice([size for size in (8, 4, 2, 1) if size <= gpus])
            priority = rng.choice(["train", "build", "interactive-preemptible"])
            node = f"node: n{number:04d}"
            workload(f"priority: {priority}", f"tasks: 1x{size}", "status: running", node)
            gpus -= size
        number += 1
    grouped = False
    for _ in range(pending):
        kind = rng.random()
        if kind < 0.15:
            replicas = rng.choice([2, 4, 8])
            workload("priority: train", f"tasks: {replicas}x8", "topology: {preferred: rack}")
        elif kind < 0.6:
            workload(
                f"priority: {rng.choice(['build', 'train'])}", f"tasks: 1x{rng.choice([1, 2, 4])}"
            )
        elif kind < 0.85:
            fraction = rng.choice(["0.25", "0.5"])
            workload("priority: interactive-preemptible", f"tasks: 1x{fraction}")
        else:
            group = _INFERENCE
            if anchors:
                group = "*server" if grouped else f"&server {group}"
                grouped = True
            workload(
                "priority: inference", f"tasks: [{group}]", "node_selector: {gpu_model: [L4, A100]}"
            )
    return "\n".join(lines) + "\n"


def test_a_cluster_of_2000_nodes_written_out_is_planned(tmp_path: Path) -> None:
    text = _cluster(2000, 3000)
    assert len(text.encode()) < MAX_BYTES and "&" not in text and "*" not in text
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    done = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert done.exit_code == 0, done.output
    outcome = json.loads(done.stdout)["workloads"]
    assert len(outcome) == text.count("  - name: w") > 6000
    running = [name for name, one in outcome.items() if one["status"] == "running"]
    assert len(running) > 5000


def test_an_alias_bomb_the_size_of_a_large_cluster_is_refused_at_its_start() -> None:
    text = _laughs() + _cluster(2000, 3000).removeprefix("name: generated\n")
    started = time.monotonic()
    with pytest.raises(
        YamlLimitError, match=r"by more than \d+ values \(an alias bomb\)"
    ) as raised:
        _load(text)
    # Refused at the bomb, in the first lines: the rest of the file is never read (its
    # reading alone takes seconds). The time is a guard against expanding the bomb.
    assert raised.value.problem_mark is not None and raised.value.problem_mark.line < 9
    assert time.monotonic() - started < 5


def test_a_cluster_written_with_anchors_reads_as_written_out() -> None:
    shortened = _cluster(1200, 600, anchors=True)
    # Anchors reused hundreds of times: 1,200 nodes' labels, 90 inference task groups.
    assert shortened.count("*") > 1200 and shortened.count("*H100") > 600
    assert parse_scenario(shortened, "S.yaml") == parse_scenario(_cluster(1200, 600), "S.yaml")


# The resident memory of `corral plan` on a two-line file is about 60 MB.
MAX_RSS_MB = 160


def _corral(*args: str | Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the console script; its result and its peak resident memory in MB (measured
    by a parent of its own, which has waited for no other child)."""
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "300"}
    # No server: apply must refuse the file before it tries to connect.
    env["CORRAL_SERVER"] = "http://127.0.0.1:9"
    env["CORRAL_TOKEN"] = "none"
    measure = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:])\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, file=sys.stderr)\n"
        "sys.exit(done.returncode)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, str(CORRAL), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    *lines, rss = done.stderr.strip().splitlines()
    done.stderr = "\n".join(lines)
    return done, int(rss)


def _check_refused(done: subprocess.CompletedProcess[str], path: Path, words: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(str(path)), lines[0]
    assert words in lines[0], lines[0]
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_plan_exits_2_with_one_line_naming_the_file_in_little_memory(
    tmp_path: Path, name: str
) -> None:
    text, words = HOSTILE[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    done, rss = _corral("plan", path)
    _check_refused(done, path, words)
    assert rss < MAX_RSS_MB, f"{rss} MB"


@pytest.mark.parametrize("command", ["apply", "simulate"])
@pytest.mark.parametrize("name", ["billion-laughs", "too-large"])
def test_apply_and_simulate_exit_2_with_one_line_naming_the_file(
    tmp_path: Path, command: str, name: str
) -> None:
    text, words = HOSTILE[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    args: list[str | Path] = (
        ["apply", "-f", path] if command == "apply" else ["simulate", path, "--trace", "x"]
    )
    done, _ = _corral(*args)
    _check_refused(done, path, words)
