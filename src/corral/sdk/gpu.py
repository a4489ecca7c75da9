"""Keeping frameworks inside a fraction of a GPU.

A task given part of a device gets CORRAL_GPU_FRACTION and CORRAL_GPU_MEMORY_LIMIT (bytes).
TensorFlow is told by TF_FORCE_GPU_ALLOW_GROWTH=true not to take the whole device at start;
PyTorch needs one call, made early in the program:

    from corral.sdk import limit_gpu_memory
    limit_gpu_memory()
"""

from __future__ import annotations

import os
from typing import Any


def gpu_fraction() -> float | None:
    """The fraction of its device this task was given, or None for whole devices."""
    value = os.environ.get("CORRAL_GPU_FRACTION")
    return float(value) if value else None


def limit_gpu_memory(torch_module: Any = None) -> float | None:
    """Cap PyTorch's allocator on every visible device at this task's share of its memory.

    Returns the fraction applied, or None when the task has whole devices (nothing to do).
    `torch_module` defaults to `import torch`; it is a parameter so that code that imports
    torch lazily can pass it in.
    """
    fraction = gpu_fraction()
    if fraction is None:
        return None
    torch = torch_module
    if torch is None:
        import torch  # type: ignore[no-redef]
    if not torch.cuda.is_available():
        return fraction
    for device in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction
