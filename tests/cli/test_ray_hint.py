"""`--ray` where Ray is not installed: the exact hint, and nothing started.

Ray is installed here (it is a dev extra), so each command runs in a Python in which the
`ray` module cannot be imported (`sys.modules["ray"] = None`, Python's own mark for "no
such module"), as on a machine with corral alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WITHOUT_RAY = (
    "import sys; sys.modules['ray'] = None; "
    "sys.argv[0] = 'corral'; "
    "from corral.cli.main import app; app()"
)


@pytest.mark.parametrize("command", ["up", "server"])
@pytest.mark.parametrize("address", ["127.0.0.1:6379", "auto"])
def test_ray_without_ray_gives_the_install_hint_and_starts_nothing(
    tmp_path: Path, command: str, address: str
) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, command, "--ray", address, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "--ray needs Ray, which is not installed: pip install 'corral[ray]'" in done.stderr
    assert "Traceback" not in done.stderr
    # Refused before anything was set up: no data directory, so no store and no token.
    assert not data.exists()
    assert "token" not in done.stdout.lower()
