"""Hostile YAML: `corral plan`, `corral simulate` and `corral apply` read it within bounds
(corral.scenario.yamlio) and answer exit 2 with one line naming the file and the problem;
never a traceback, a hang or hundreds of MB."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from corral.scenario import ScenarioError, parse_scenario, yamlio
from corral.scenario.yamlio import (
    MAX_ALIASES,
    MAX_BYTES,
    MAX_DEPTH,
    MAX_NODES,
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


# name -> (text, words the one-line message must hold)
HOSTILE = {
    "billion-laughs": (_laughs(), f"more than {MAX_NODES} values"),
    "deep-flow": ("[" * 100_000 + "]" * 100_000, f"nested more than {MAX_DEPTH} levels"),
    "deep-block": ("".join(" " * i + "a:\n" for i in range(200)), "nested more than"),
    "self-reference": ("nodes: &a [*a]\n", "refers to a node that contains it"),
    "many-aliases": (
        "x: &x 1\ny: [" + ",".join(["*x"] * (MAX_ALIASES + 1)) + "]\n",
        f"more than {MAX_ALIASES} aliases",
    ),
    "many-values": ("[" + ",".join(["1"] * (MAX_NODES + 1)) + "]\n", "values"),
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
    # (many-values: MAX_NODES composed in pure Python) takes a few seconds.
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


def test_the_counts_run_over_the_whole_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamlio, "MAX_NODES", 1000)
    # Each document is small; together they pass the bound.
    document = "[" + ",".join(["1"] * 99) + "]\n---\n"
    loaded = yaml.load_all(document * 9, Loader=BoundedLoader)
    assert len([d for d in loaded if d is not None]) == 9
    with pytest.raises(YamlLimitError, match="more than 1000 values"):
        list(yaml.load_all(document * 10, Loader=BoundedLoader))


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
    args = ["apply", "-f", path] if command == "apply" else ["simulate", path, "--trace", "x"]
    done, _ = _corral(*args)
    _check_refused(done, path, words)
