"""The shared traces, for the tests that read them.

Tests that read traces skip when the folder is absent, except on CI (CI=true), where a
missing folder is a failure: CI must run them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sim_support import traces_dir


@pytest.fixture(scope="session")
def traces() -> Path:
    folder = traces_dir()
    if not folder.is_dir():
        message = f"the shared traces are not at {folder} (set CORRAL_TRACES)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return folder
