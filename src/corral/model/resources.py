"""Resource vectors (GPU, CPU, memory) and the units they are written in."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

_UNITS = {"": 1, "B": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB, "TiB": TIB}
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)?\s*$")

# Amounts are floats (GPU fractions, CPU millicores); comparisons allow for rounding.
EPSILON = 1e-9


def parse_memory(text: str | int | float) -> int:
    """Parse a memory amount with a binary unit ("512MiB", "80GiB") into bytes.

    A bare number is taken as bytes. Raises ValueError with the offending text.
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a memory amount")
    if isinstance(text, int | float):
        if text < 0 or not math.isfinite(text):
            raise ValueError(f"{text!r} is not a memory amount")
        return int(text)
    match = _MEMORY_RE.match(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a memory amount (use a binary unit: 512MiB, 64GiB, 1TiB)"
        )
    number, unit = match.groups()
    amount = float(number) * _UNITS[unit or ""]
    if not math.isfinite(amount):
        # A number of hundreds of digits: no machine has that much, and int() would fail.
        raise ValueError(f"{text[:40]!r}... is not a memory amount (far too large)")
    return int(amount)


def format_memory(amount: float) -> str:
    """Render bytes in the largest binary unit that keeps a short number."""
    if math.isinf(amount):
        return "unlimited"
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if amount >= size:
            value = amount / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{amount:.0f}B"


@functools.lru_cache(maxsize=4096)
def format_gpus(amount: float) -> str:
    """Render a GPU amount: "3" for whole devices, "0.5" for fractions, "unlimited"."""
    if math.isinf(amount):
        return "unlimited"
    rounded = round(amount, 3)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:g}"


@functools.lru_cache(maxsize=4096)
def plural_gpus(amount: float) -> str:
    """ "1 GPU", "2 GPUs", "0.5 GPU", "0 GPUs"."""
    text = format_gpus(amount)
    return f"{text} GPU" if 0 < amount <= 1 else f"{text} GPUs"


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of each schedulable resource: GPUs (devices), CPU (cores), memory (bytes)."""

    gpu: float = 0.0
    cpu: float = 0.0
    memory: float = 0.0

    NAMES = ("gpu", "cpu", "memory")

    def get(self, name: str) -> float:
        """The amount of one resource by its name in NAMES."""
        value: float = getattr(self, name)
        return value


UNLIMITED = Resources(math.inf, math.inf, math.inf)


def gpu_quota(gpus: float) -> Resources:
    """A deserved quota of `gpus` GPUs that leaves CPU and memory unmanaged."""
    return Resources(gpus, math.inf, math.inf)
