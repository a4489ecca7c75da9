"""Schemathesis against the OpenAPI document of a live server, as its admin.

Every operation gets generated requests, valid and invalid: the server must never answer
5xx, every response must match the schema the document declares for it, and every status
code must be one the document lists. A stateful run follows the links schemathesis infers
between operations (create a queue, then get, patch and delete it), which reaches further
than random names do. Examples are bounded so that the module takes well under a minute;
FUZZ_EXAMPLES=500 searches deeper.

Operations are driven through schemathesis' Python API (`as_strategy` under Hypothesis'
`@given`, and its engine for the stateful run): its pytest integration
(`schemathesis.pytest.from_fixture`) fails on pytest 9, which no longer has
`Node._nodeid`, and a schema loaded at import time cannot come from a server that a
fixture starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
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

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
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


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzz_server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    start_server: Callable[..., Any],
) -> Iterator[Any]:
    """A server with something in it: a project, nodes, a running and a pending workload.
    They are named "0" and "1", the first strings Hypothesis tries for a name, so that
    generated paths find them (and, say, DELETE /nodes/0 removes a node with work)."""
    db = request.getfixturevalue("postgres")() if request.param == "postgresql" else None
    server = start_server(tmp_path_factory.mktemp(f"fuzz-{request.param}"), db)
    api = Api(server)
    for name in ("0", "1"):
        response = api.admin.post("/nodes", json={"name": name, "gpus": 4})
        assert response.status_code == 201, response.text
    response = api.admin.post("/queues", json={"name": "0", "deserved": 8})
    assert response.status_code == 201, response.text
    api.submit("0", "", name="0", node_selector={})
    api.submit("0", "", gpu=16, name="1", node_selector={})
    api.wait_status("0", "running")
    api.close()
    yield server
    server.stop()


def _schema(server: Any, **config: Any) -> Any:
    settings = {
        "headers": {"Authorization": f"Bearer {server.token}"},
        # Every run starts afresh, and nothing is written to the working directory.
        "cache": {"enabled": False},
        **config,
    }
    return schemathesis.openapi.from_url(
        f"{server.api}/openapi.json", config=schemathesis.Config.from_dict(settings)
    )


def _fuzz(server: Any, checks: list[Callable[..., Any]]) -> list[str]:
    """Run every operation with valid and with invalid data. Returns the failures, at
    most one per operation and kind of data, each with a request that reproduces it (the
    first failed check ends the search in that operation: fix it, and run again)."""
    failures = []
    for result in _schema(server).get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @FUZZ
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
    fuzz_server: Any,
) -> None:
    failures = _fuzz(
        fuzz_server, [not_a_server_error, response_schema_conformance, status_code_conformance]
    )
    assert not failures, "\n\n".join(failures)


def test_stateful_no_server_error_and_responses_match_the_schema(fuzz_server: Any) -> None:
    schema = _schema(
        fuzz_server,
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
    scenarios = 0
    for event in engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            scenarios += 1
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.failure_info is not None:
                        info = check.failure_info
                        failures.append(f"{check.name}: {info.failure}\n{info.code_sample}")
        elif isinstance(event, events.NonFatalError | events.FatalError):
            failures.append(f"error: {getattr(event, 'value', None) or event.exception}")
        elif isinstance(event, events.EngineFinished):
            failures.extend(str(failure) for failure in event.failures)
    assert scenarios > 0, "the stateful phase ran no scenario"
    assert not failures, "\n\n".join(failures)
