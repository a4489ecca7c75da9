"""The errors the engine raises. Each is a ValueError, so callers that catch ValueError
(the scenario loader, the server) keep working."""

from __future__ import annotations


class EngineError(ValueError):
    """A cycle could not run on its input."""


class SnapshotError(EngineError):
    """The snapshot contradicts itself: a workload in no leaf queue, listed twice, or
    placed on a node the snapshot does not have."""


class ConfigError(EngineError):
    """The scheduler configuration names something the engine does not know."""
