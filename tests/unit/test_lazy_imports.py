"""The CLI starts without the engine, the simulator and numpy, which only `plan` and
`simulate` need: corral.scenario and corral.sim import each name when it is first used."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

HEAVY = ("numpy", "corral.engine", "corral.scenario.runner", "corral.sim.loaders")


def test_the_cli_starts_without_the_engine_or_numpy() -> None:
    probe = (
        "import sys, corral.cli.main; "
        f"print(' '.join(name for name in {HEAVY!r} if name in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == ""


@pytest.mark.parametrize("package", ["corral.scenario", "corral.sim"])
def test_every_name_of_a_lazy_package_is_there(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert value is getattr(module, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018
