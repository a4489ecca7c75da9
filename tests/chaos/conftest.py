"""The chaos suite drives `corral up` with the agent tests' helpers (tests/agent/livecorral.py);
pytest puts only a test's own directory on the import path, so this adds that one."""

from __future__ import annotations

import sys
from pathlib import Path

AGENT_TESTS = str(Path(__file__).resolve().parents[1] / "agent")
if AGENT_TESTS not in sys.path:
    sys.path.append(AGENT_TESTS)
