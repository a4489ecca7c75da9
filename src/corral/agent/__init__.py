"""The node agent: device discovery (NVML or virtual), task processes, reports."""

from corral.agent.agent import Agent
from corral.agent.devices import Discovery, discover

__all__ = ["Agent", "Discovery", "discover"]
