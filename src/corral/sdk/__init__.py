"""For users' code: the API client, and helpers for preemption, checkpoints and fractions.

`Client` speaks to a server; `ApiError` and `ServerUnreachable` are what it raises;
`corral.sdk.types` types the JSON it returns.
"""

from corral.sdk import preemption
from corral.sdk.client import (
    ApiError,
    Client,
    CorralError,
    FieldProblem,
    ServerUnreachable,
)
from corral.sdk.gpu import gpu_fraction, limit_gpu_memory
from corral.sdk.preemption import checkpointed
from corral.sdk.telemetry import report_utilization

__all__ = [
    "ApiError",
    "Client",
    "CorralError",
    "FieldProblem",
    "ServerUnreachable",
    "checkpointed",
    "gpu_fraction",
    "limit_gpu_memory",
    "preemption",
    "report_utilization",
]
