"""Schemathesis against the OpenAPI document of a live server, as its admin: `corral server`
on SQLite and on PostgreSQL, and `corral up` with its agent and virtual GPUs, where
accepted workloads really run (every command is replaced by a short sleep first).

Every operation gets generated requests, valid and invalid: the server must never answer
5xx, every response must match the schema the document declares for it, and every status
code must be one the document lists. A stateful run follows the links schemathesis infers
between operations (create a queue, then get, patch and delete it), which reaches further
than random names do. Examples are bounded (12 an operation and kind of data on SQLite,
4 on the other two: the API's own checks are the same on every backend), so that the
module takes a few minutes of CI; FUZZ_EXAMPLES=500 searches deeper.

Operations are driven through schemathesis' Python API (`as_strategy` under Hypothesis'
`@given`, and its engine for the stateful run): its pytest integration
(`schemathesis.pytest.from_fixture`) fails on pytest 9, which no longer has
`Node._nodeid`, and a schema loaded at import time cannot come from a server that a
fixture starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, engine
from schemathesis.checks import not_a_server_error
from schemathesis.engine import events
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)
from server_support import Api

# `corral up` is started by the agent tests' helper; pytest puts only this directory on
# the import path.
sys.path.append(str(Path(__file__).resolve().parents[1] / "agent"))
from livecorral import CorralUp

# Minutes of work: started before the other modules (tests/conftest.py).
pytestmark = pytest.mark.long

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
# The whole search once, on SQLite; a shorter one where only the store and the running
# tasks differ (at 25 each, the three took 18 minutes of one CI worker, a third of it;
# at 15 and 6, 311, 200 and 198 s of a full run's 6,000 worker seconds, most of it in
# this process making up the requests, not in the servers answering them).
EXAMPLES_ON = {"sqlite": EXAMPLES, "postgresql": max(EXAMPLES * 2 // 5, 1)}
EXAMPLES_ON["agent"] = EXAMPLES_ON["postgresql"]
# What any accepted workload runs, whatever the fuzzer wrote: it must not matter which
# program a random string names. Environment variables that change how a process starts
# are dropped for the same reason.
HARMLESS = ["/bin/sleep", "0.2"]
STARTUP_ENV = ("LD_", "PYTHON", "PATH")
# Requests sent, by test, for the figures in docs/reliability.md; `counting` names the
# test that runs.
SENT: dict[str, int] = {}
counting = [""]
# No shrinking: a failure is reported with the request that reproduces it, and shrinking
# a failure against a live server costs more time than it saves reading.
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)


@dataclass
class AgentServer:
    """`corral up` (server and agent in one process) with what the tests read of a server."""

    up: CorralUp

    @property
    def api(self) -> str:
        return f"{self.up.url}/api/v1"

    @property
    def token(self) -> str:
        return self.up.token

    def client(self) -> Any:
        return self.up.client()

    def stop(self) -> None:
        """Kill it and every task it started (workload "0" sleeps for an hour)."""
        self.up.close()


def _confine(body: Any) -> None:
    """Make a workload body that the server may accept harmless to run."""
    if not isinstance(body, dict):
        return
    command = body.get("command", [])
    if isinstance(command, list) and all(isinstance(word, str) for word in command):
        # Also where none was given, so that accepted workloads run rather than fail.
        body["command"] = list(HARMLESS)
    env = body.get("env")
    if isinstance(env, dict):
        for key in [k for k in env if isinstance(k, str) and k.startswith(STARTUP_ENV)]:
            del env[key]


# The id of the admin's first token, which every fuzzing request is sent with.
OWN_TOKEN_ID = 1
# Seconds the schema may take to arrive.
SCHEMA_SECONDS = 120
# Seconds a fuzzing request may wait for a workload (GET /workloads/NAME?until=...).
WAIT = 0.05


def before_call(context: Any, case: schemathesis.Case, kwargs: Any) -> None:
    """Before every call: workloads submitted, alone or in a batch, run HARMLESS; the
    token the fuzzer itself uses is never revoked (once it has made another admin token,
    revoking the first is allowed, and every later request would be a 401); a read that
    waits for a workload (`until`) waits at most WAIT (the pending workload "1" would
    hold each such request for up to a minute)."""
    path, body = case.operation.path, case.body
    parameters = case.path_parameters or {}
    if case.method.upper() == "DELETE" and parameters.get("token_id") == OWN_TOKEN_ID:
        parameters["token_id"] = 10**9  # no such token: a 404
    query = case.query if isinstance(case.query, dict) else {}
    # A wait the server refuses stays as generated: its 422 is checked too.
    if "until" in query and ("wait" not in query or _seconds(query["wait"]) is not None):
        query["wait"] = WAIT
    if case.method.upper() != "POST":
        return
    if path.endswith("/workloads"):
        _confine(body)
    elif path.endswith("/workloads/batch") and isinstance(body, dict):
        workloads = body.get("workloads")
        for workload in workloads if isinstance(workloads, list) else []:
            _confine(workload)


def _seconds(value: Any) -> float | None:
    """A wait the server takes (more than 0, at most 60 seconds), or None."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if 0 < seconds <= 60 else None


def after_call(context: Any, case: Any, response: Any) -> None:
    """After every call: count it."""
    SENT[counting[0]] = SENT.get(counting[0], 0) + 1


@pytest.fixture(scope="module", autouse=True)
def hooks() -> Iterator[None]:
    """Schemathesis runs these two hooks only when registered globally: for this module
    alone, then."""
    for hook in (before_call, after_call):
        schemathesis.hook(hook)
    yield
    for hook in (before_call, after_call):
        schemathesis.hooks.unregister(hook)


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "agent"])
def fuzz_server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    start_server: Callable[..., Any],
) -> Iterator[Any]:
    """A server with something in it: a project, nodes, a running and a pending workload.
    They are named "0" and "1", the first strings Hypothesis tries for a name, so that
    generated paths find them (and, say, DELETE /nodes/0 removes a node with work)."""
    data_dir = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    server: Any
    if request.param == "agent":
        server = AgentServer(CorralUp(data_dir, gpus=4).start())
    else:
        db = request.getfixturevalue("postgres")() if request.param == "postgresql" else None
        server = start_server(data_dir, db)
    api = Api(server)
    # With an agent, "0" runs for the whole module (and "1" waits for a node of a pool
    # that has none: a workload no node could ever hold is refused at submit).
    command = {"command": ["/bin/sleep", "3600"]} if request.param == "agent" else {}
    for name in ("0", "1"):
        response = api.admin.post("/nodes", json={"name": name, "gpus": 4})
        assert response.status_code == 201, response.text
    response = api.admin.post("/queues", json={"name": "0", "deserved": 8})
    assert response.status_code == 201, response.text
    api.submit("0", "", name="0", node_selector={}, **command)
    api.submit("0", "", gpu=4, name="1", node_selector={"pool": "none-yet"}, **command)
    api.wait_status("0", "running")
    api.close()
    yield server
    server.stop()


def _schema(server: Any, counter: str, **config: Any) -> Any:
    """The server's schema as schemathesis loads it; its requests are counted under
    `counter`."""
    counting[0] = counter
    settings = {
        "headers": {"Authorization": f"Bearer {server.token}"},
        # Every run starts afresh, and nothing is written to the working directory.
        "cache": {"enabled": False},
        **config,
    }
    # The server makes its schema on the first request for it: seconds of CPU, and more
    # than schemathesis's 10 s when a CI run starts dozens of servers at once (seen).
    schema = schemathesis.openapi.from_url(
        f"{server.api}/openapi.json",
        config=schemathesis.Config.from_dict(settings),
        timeout=SCHEMA_SECONDS,
    )
    return schema


def _fuzz(server: Any, checks: list[Callable[..., Any]], counter: str, examples: int) -> list[str]:
    """Run every operation with valid and with invalid data, `examples` of each. Returns
    the failures, at most one per operation and kind of data, each with a request that
    reproduces it (the first failed check ends the search in that operation: fix it, and
    run again)."""
    failures = []
    for result in _schema(server, counter).get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(FUZZ, max_examples=examples)
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: schemathesis.Case) -> None:
                case.call_and_validate(checks=checks)

            try:
                run()
            except Unsatisfiable:
                pass  # nothing in this operation can be made invalid (no body, free strings)
            except (Exception, BaseExceptionGroup) as error:  # a failed check, or no server
                failures.append(f"{operation.label} ({mode.value} data):\n{error}")
    return failures


def test_no_server_error_responses_match_the_schema_status_codes_documented(
    fuzz_server: Any, request: pytest.FixtureRequest
) -> None:
    checks = [not_a_server_error, response_schema_conformance, status_code_conformance]
    examples = EXAMPLES_ON[request.node.callspec.params["fuzz_server"]]
    failures = _fuzz(fuzz_server, checks, request.node.name, examples)
    print(f"\n{request.node.name}: {SENT.get(request.node.name, 0)} requests")
    assert not failures, "\n\n".join(failures)


def test_stateful_no_server_error_and_responses_match_the_schema(
    fuzz_server: Any, request: pytest.FixtureRequest
) -> None:
    schema = _schema(
        fuzz_server,
        request.node.name,
        seed=1,
        workers=1,
        checks={
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
        },
        phases={
            "examples": {"enabled": False},
            "coverage": {"enabled": False},
            "fuzzing": {"enabled": False},
            "stateful": {"enabled": True, "max-steps": 8},
        },
        generation={"max-examples": max(EXAMPLES, 40)},
    )
    failures: list[str] = []
    scenarios = links = 0
    for event in engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            scenarios += 1
            # A step that used a link: its request was built from an earlier response.
            links += sum(1 for case in event.recorder.cases.values() if case.transition)
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.failure_info is not None:
                        info = check.failure_info
                        failures.append(f"{check.name}: {info.failure}\n{info.code_sample}")
        elif isinstance(event, events.NonFatalError | events.FatalError):
            failures.append(f"error: {getattr(event, 'value', None) or event.exception}")
        elif isinstance(event, events.EngineFinished):
            failures.extend(str(failure) for failure in event.failures)
    print(
        f"\n{request.node.name}: {SENT.get(request.node.name, 0)} requests in {scenarios} "
        f"scenarios, {links} steps through links"
    )
    assert scenarios > 0, "the stateful phase ran no scenario"
    assert links > 0, "no step followed a link: the stateful run tested single operations"
    assert not failures, "\n\n".join(failures)
