"""What every body of the REST API shares: the base of request bodies (unknown fields
refused), names, strings the OS can take, memory and durations, and the error body."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from corral.model import (
    parse_memory,
)
from corral.model.durations import parse_duration

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


Name = Annotated[str, Field(pattern=NAME_PATTERN, min_length=1, max_length=63)]


ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


# A dependency: a workload's name (PROJECT/NAME for another project's), then ":ok" (it
# succeeded, the default) or ":any" (ended).
AFTER_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(:(ok|any))?$"


# A secret is named as the environment variable it becomes by default.
SecretName = Annotated[str, Field(pattern=ENV_PATTERN, min_length=1, max_length=63)]


LabelKey = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$", max_length=63)
]


LabelValue = Annotated[str, Field(max_length=63)]


# A node pool: the value of a node's `pool` label.
PoolName = Annotated[str, Field(min_length=1, max_length=63)]


Memory = Annotated[int | str, Field(description='bytes, or a binary unit: "512MiB", "80GiB"')]


# Amounts are bounded so that arithmetic never overflows and JSON stays finite.
Amount = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]


def _seconds(value: float | str) -> float:
    # parse_duration's ValueError says what was wrong; pydantic names the field.
    return parse_duration(value)


# A min-runtime: seconds, or a duration such as "10m"; answered in seconds.
MinRuntime = Annotated[
    float | str,
    Field(description='seconds, or a duration: "90s", "10m", "4h"'),
    AfterValidator(_seconds),
]


MAX_MEMORY = 1 << 60


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


# The most workloads one batch submission may carry.
BATCH_LIMIT = 1000


class Body(BaseModel):
    # Strict: `"virtual": 0` or `"grace_period": false` are mistakes to report, not values
    # to coerce (JSON integers still count as numbers where a float is expected).
    model_config = ConfigDict(extra="forbid", strict=True)


def _os_string(value: str) -> str:
    """A string the kernel can take in argv, the environment or a path: no NUL byte."""
    if "\0" in value:
        raise ValueError("must not contain a NUL byte")
    return value


# Strings that become a task's argv, environment or working directory.
OsString = Annotated[str, AfterValidator(_os_string)]


Argument = Annotated[OsString, Field(max_length=65536)]


# A Unix login name as useradd accepts it (POSIX portable, at most 32 bytes).
UnixUser = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]*\$?$", min_length=1, max_length=32)]


def memory_bytes(value: int | str) -> int:
    """Memory in bytes; raises ValueError with a readable message."""
    amount = parse_memory(value)
    if amount > MAX_MEMORY:
        raise ValueError(f"{value!r} is more than 1 EiB")
    return amount


def duration_seconds(value: float | str) -> float:
    """Seconds from 3600, "90m", "4h" or "2d"."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a duration (for example 90m, 4h, 2d)")
        seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    if not (0 < seconds <= 365 * 86400):
        raise ValueError("must be more than 0 and at most a year")
    return seconds


# Time-decayed fair share's usage factor k: how strongly usage moves a queue's weight.
UsageFactor = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]


class ErrorOut(BaseModel):
    detail: str
