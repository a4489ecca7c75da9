"""Helpers for the simulator's tests."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def traces_dir() -> Path:
    """$CORRAL_TRACES, else `../shared/traces` beside the repository."""
    configured = os.environ.get("CORRAL_TRACES")
    return Path(configured) if configured else REPO.parent / "shared" / "traces"


def head(source: Path, target: Path, lines: int) -> Path:
    """Copy the first `lines` lines of `source` (header included) to `target`."""
    with source.open(encoding="utf-8") as handle:
        text = "".join(line for _, line in zip(range(lines), handle, strict=False))
    target.write_text(text, encoding="utf-8")
    return target
