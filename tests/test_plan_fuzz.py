"""Hypothesis writes scenario files, valid and broken, and `corral plan` reads each one.

Whatever the file holds, plan answers 0 (no expectation failed), 1 (one failed) or 2 (the
file is invalid, with one line naming it): never a traceback, never exit 3 ("internal
error"), never a hang. Files come two ways: scenario documents whose every field is
mostly plausible and sometimes junk (wrong types, huge or negative numbers, unknown
names), dumped as YAML; and the repository's own scenario files with random edits to
their text, which reach the YAML parser's errors. In process through Typer's runner,
so that 300 files take about ten seconds; PLAN_FUZZ_EXAMPLES=2000 searches deeper.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from corral.cli.main import app

EXAMPLES = int(os.environ.get("PLAN_FUZZ_EXAMPLES", "300"))
# One file's plan may take this long; more is a hang.
SECONDS_PER_FILE = 10
SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

NODES = ("node0", "node1", "n-2")
QUEUES = ("q", "dept", "team-a")
WORKLOADS = ("w-1", "w-2", "g-1", "f-1")

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2),
)


def mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` nineteen times in twenty, junk otherwise: a file has dozens of fields, and
    most files should get past the loader to the scheduler."""
    return st.integers(0, 19).flatmap(lambda roll: junk if roll == 0 else good)


def section(
    required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[Any]:
    """A mapping of the given fields, now and then with a field the format does not know."""
    fields = st.fixed_dictionaries(required, optional=optional)
    return mostly(st.one_of(fields, fields, st.builds(lambda f: {**f, "colour": "blue"}, fields)))


# Counts that build something per unit (devices, tasks, cycles): mostly small, now and
# then huge, which plan must refuse rather than build.
def counts(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(low, high), st.integers(low, high), st.integers(10**5, 10**12))


amounts = st.one_of(st.integers(0, 16), st.sampled_from([0.25, 0.5, 1.5]))
memory = st.sampled_from(["40GiB", "80GiB", "512MiB", "1TiB", "0", "12", "1e3GiB", 0])
names = st.one_of(st.sampled_from(NODES + QUEUES + WORKLOADS), st.text(max_size=8))
shorthand = st.builds(
    lambda count, gpu: f"{count}x{gpu}",
    counts(0, 5),
    st.sampled_from(["1", "2", "0.5", "0.25", "0", "A"]),
)
task_group = section(
    {},
    {
        "name": st.sampled_from(["worker", "ps", "w"]),
        "replicas": mostly(counts(1, 4)),
        "gpu": mostly(amounts),
        "gpu_memory": memory,
        "cpu": mostly(amounts),
        "memory": memory,
    },
)
quota = st.one_of(
    amounts, section({}, {"gpu": mostly(amounts), "cpu": mostly(amounts), "memory": memory})
)

node = section(
    {"name": mostly(st.sampled_from(NODES))},
    {
        "gpus": mostly(counts(0, 8)),
        "gpu_memory": memory,
        "gpu_model": mostly(st.sampled_from(["a100", "h100"])),
        "cpu": mostly(amounts),
        "memory": memory,
        "labels": mostly(st.dictionaries(st.sampled_from(["rack", "zone"]), names, max_size=2)),
    },
)
queue = section(
    {"name": mostly(st.sampled_from(QUEUES))},
    {
        "parent": mostly(st.sampled_from(QUEUES)),
        "deserved": mostly(quota),
        "limit": mostly(quota),
        "over_quota_weight": mostly(quota),
        "priority": mostly(st.integers(-5, 5)),
    },
)
workload = section(
    {"name": mostly(st.sampled_from(WORKLOADS)), "queue": mostly(st.sampled_from(QUEUES))},
    {
        "priority": mostly(st.sampled_from(["train", "build", "inference", "interactive", 7])),
        "preemptible": mostly(st.booleans()),
        "tasks": mostly(st.one_of(shorthand, st.lists(task_group, min_size=1, max_size=2))),
        "min_available": mostly(st.integers(1, 4)),
        "node_selector": mostly(st.dictionaries(st.sampled_from(["rack", "zone"]), names)),
        "topology": mostly(section({}, {"required": names, "preferred": names})),
        "status": mostly(st.sampled_from(["pending", "running"])),
        "node": mostly(st.sampled_from((*NODES, "any"))),
        "nodes": mostly(st.lists(st.sampled_from(NODES), max_size=3)),
        "gpu_group": mostly(st.integers(0, 3)),
    },
)
expect = section(
    {},
    {
        "running": mostly(st.dictionaries(st.sampled_from(WORKLOADS), st.sampled_from(NODES))),
        "pending": mostly(st.lists(st.sampled_from(WORKLOADS), max_size=3)),
        "evicted": mostly(st.lists(st.sampled_from(WORKLOADS), max_size=3)),
        "same_gpu": mostly(st.lists(st.lists(st.sampled_from(WORKLOADS), max_size=3))),
    },
)
documents = section(
    {},
    {
        "name": mostly(st.just("fuzz")),
        "description": mostly(st.text(max_size=20)),
        "scheduler": section(
            {},
            {
                "placement": mostly(st.sampled_from(["binpack", "spread"])),
                "gpu_placement": mostly(st.sampled_from(["pack", "spread"])),
                "actions": mostly(
                    st.lists(st.sampled_from(["allocate", "reclaim", "preempt", "consolidate"]))
                ),
            },
        ),
        "run": section({}, {"cycles": mostly(st.one_of(counts(1, 5), st.just("until-stable")))}),
        "nodes": mostly(st.lists(node, max_size=3)),
        "queues": mostly(st.lists(queue, max_size=3)),
        "workloads": mostly(st.lists(workload, max_size=5)),
        "expect": expect,
    },
)


@st.composite
def edited_files(draw: st.DrawFn) -> str:
    """One of the repository's scenarios with a few random edits to its text."""
    text = draw(st.sampled_from(SCENARIOS)).read_text()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "duplicate"]))
        if kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        elif kind == "insert":
            text = text[:at] + draw(st.text("-:[]{}&*!|>#'\" \n\tx0.,?", max_size=6)) + text[at:]
        else:
            line_start = text.rfind("\n", 0, at) + 1
            line_end = text.find("\n", at) + 1 or len(text)
            text = text[:line_start] + text[line_start:line_end] * 2 + text[line_end:]
    return text


files = st.one_of(
    documents.map(lambda document: yaml.safe_dump(document, sort_keys=False)),
    edited_files(),
)


class TooSlow(Exception):
    """A plan took longer than SECONDS_PER_FILE."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block (in the main thread) after `seconds`: a hang becomes a failure
    with the file that caused it, not a CI run that never ends."""

    def expire(signum: int, frame: object) -> None:
        raise TooSlow(f"plan took more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def plan_outcome(path: Path) -> tuple[int, str]:
    """`corral plan PATH`'s exit code and output, in this process; an exception that
    escaped the command is reported as exit 3 with its type."""
    result = CliRunner().invoke(app, ["plan", str(path)], catch_exceptions=True)
    error = result.exception
    if error is not None and not isinstance(error, SystemExit):
        return 3, f"{type(error).__name__}: {error}"
    return result.exit_code, result.output


def test_plan_fuzzer_notices_an_escaped_exception(tmp_path: Path, monkeypatch: Any) -> None:
    """The check below can fail: an error that escapes plan is exit 3, not 0, 1 or 2."""

    def broken(path: object) -> None:
        raise KeyError("planted")

    # plan takes load_scenario from corral.scenario when it runs.
    monkeypatch.setattr("corral.scenario.load_scenario", broken)
    path = tmp_path / "S.yaml"
    path.write_text("name: s\n")
    code, output = plan_outcome(path)
    assert code == 3 and "planted" in output, output


# Found while writing this fuzzer (which now draws such counts now and then): each of
# these two-line files ran plan for minutes and up to 1.2 GB.
@pytest.mark.parametrize(
    "text",
    [
        "nodes: [{name: a, gpus: 100000000}]\n",
        "nodes: [{name: a, gpus: 1}]\nrun: {cycles: 100000000}\n",
        "queues: [{name: q}]\nworkloads: [{name: w, queue: q, tasks: 100000000x1}]\n",
        "queues: [{name: q}]\nworkloads: [{name: w, queue: q, tasks: [{replicas: 100000000}]}]\n",
    ],
)
def test_counts_that_would_build_too_much_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "S.yaml"
    path.write_text(text)
    with time_limit(SECONDS_PER_FILE):
        code, output = plan_outcome(path)
    assert code == 2, output
    assert "above the maximum" in output or "more than 1024 tasks" in output, output


@FUZZ
@given(text=files)
def test_plan_exits_0_1_or_2_on_any_file(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("plan") / "S.yaml"
    path.write_text(text)
    with time_limit(SECONDS_PER_FILE):
        code, output = plan_outcome(path)
    event(f"exit {code}")
    assert code in (0, 1, 2), f"exit {code}:\n{output}\n--- {path}:\n{text}"
    assert "Traceback" not in output, output
    if code == 2:
        assert output.strip().startswith(str(path)), output
