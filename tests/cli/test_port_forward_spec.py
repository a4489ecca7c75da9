"""`corral port-forward NAME SPEC`: the forms of SPEC, as kubectl reads them, and clear
errors for the others, given before anything is asked of the server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.cli.common import InvalidInput
from corral.cli.remote import parse_forward

CORRAL = str(Path(sys.executable).with_name("corral"))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("8888:8888", (8888, "8888")),
        ("8888:main", (8888, "main")),
        ("9000:tensorboard", (9000, "tensorboard")),
        ("8888", (8888, "8888")),
        (":8888", (0, "8888")),
        (":main", (0, "main")),
        ("0:main", (0, "main")),
        ("08888:08888", (8888, "8888")),
    ],
)
def test_the_forms_of_a_forward(spec: str, expected: tuple[int, str]) -> None:
    assert parse_forward(spec) == expected


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "REMOTE is missing"),
        ("8888:", "REMOTE is missing"),
        (":", "REMOTE is missing"),
        ("main", "a port name needs a local port: LOCAL:main or :main"),
        ("1:2:3", "one colon at most"),
        ("x:main", "LOCAL must be a port number"),
        ("-1:main", "LOCAL must be a port number"),
        ("70000:main", "LOCAL must be a port number"),
        ("8888:0", "REMOTE must be a port number from 1 to 65535"),
        ("8888:70000", "REMOTE must be a port number from 1 to 65535"),
        ("70000", "LOCAL must be a port number"),
        ("8888:Main", "REMOTE must be a port number or a declared port's name"),
        ("8888:../x", "REMOTE must be a port number or a declared port's name"),
        ("8888:a b", "REMOTE must be a port number or a declared port's name"),
    ],
)
def test_a_bad_forward_is_named(spec: str, says: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_forward(spec)
    assert says in str(raised.value) and repr(spec) in str(raised.value)


def test_the_command_refuses_a_bad_spec_before_reaching_the_server(tmp_path: Path) -> None:
    # A server address where nothing listens: the spec is refused before any connection.
    env = {**os.environ, "HOME": str(tmp_path), "CORRAL_SERVER": "http://127.0.0.1:9"}
    env["CORRAL_TOKEN"] = "crl_unused"
    done = subprocess.run(
        [CORRAL, "port-forward", "nb", "8888:Main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "REMOTE must be a port number or a declared port's name" in done.stderr
    assert "cannot reach" not in done.stderr
