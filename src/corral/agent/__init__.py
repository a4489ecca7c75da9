"""The node agent: device discovery (NVML or virtual), task processes, reports.

`Agent`, `Discovery` and `discover` are loaded on first use: every task's launcher
(`python -I -m corral.agent.launch`) imports this package, and must not pay for the whole
agent (telemetry, NVML) on each start.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.agent.agent import Agent
    from corral.agent.devices import Discovery, discover

__all__ = ["Agent", "Discovery", "discover"]
_WHERE = {
    "Agent": "corral.agent.agent",
    "Discovery": "corral.agent.devices",
    "discover": "corral.agent.devices",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
