"""What the benchmarks share: where the traces are, small table printing, and a fresh
PostgreSQL database."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def traces_dir() -> Path:
    """$CORRAL_TRACES, else `../shared/traces` beside the repository; exits if absent."""
    configured = os.environ.get("CORRAL_TRACES")
    folder = Path(configured) if configured else REPO.parent / "shared" / "traces"
    if not folder.is_dir():
        sys.exit(f"the shared traces are not at {folder} (set CORRAL_TRACES)")
    return folder


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, columns padded so it also reads as plain text."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


@contextmanager
def postgres_url() -> Iterator[str]:
    """A fresh database on a PostgreSQL server started by pgserver for this run."""
    import pgserver

    root = tempfile.mkdtemp(prefix="corral-bench-pg-")
    server = pgserver.get_server(root, cleanup_mode="delete")
    try:
        server.psql("CREATE DATABASE corral_bench;")
        yield server.get_uri().replace("/postgres?", "/corral_bench?")
    finally:
        server.cleanup()
