"""For users' code: the API client, and helpers for preemption, checkpoints and fractions."""

from corral.sdk import preemption
from corral.sdk.gpu import gpu_fraction, limit_gpu_memory

__all__ = ["gpu_fraction", "limit_gpu_memory", "preemption"]
