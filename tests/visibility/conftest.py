"""Fixtures for the visibility tests: a real store on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.store import Store


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty, migrated store on each backend."""
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres")()
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    else:
        url = f"sqlite:///{tmp_path / 'corral.db'}"
    opened = Store(url)
    yield opened
    opened.close()
