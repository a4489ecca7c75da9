"""Job arrays and dependencies, as plain data: `0-99%8` and `train:ok`, parsed and checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# The most members one array may have, and the highest index (so that NAME-INDEX stays a
# short name).
MAX_ARRAY_SIZE = 10_000
MAX_ARRAY_INDEX = 999_999
CONDITIONS = ("ok", "any")
Condition = Literal["ok", "any"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True, slots=True)
class ArrayMember:
    """One workload of an array: the array's name, its own index, and how many members
    may run at once (None: no limit)."""

    name: str
    index: int
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class Dependency:
    """Wait for `workload` to succeed (`ok`) or to end in any way (`any`)."""

    workload: str
    condition: Condition = "ok"

    def __str__(self) -> str:
        return f"{self.workload}:{self.condition}"


def parse_array(text: str) -> tuple[tuple[int, ...], int | None]:
    """The indices and the running limit of `0-99%8`, `1,3,5-7` or `0-9%2`; raises
    ValueError saying what is wrong. Indices come out sorted, each once."""
    body, _, limit_text = text.strip().partition("%")
    limit: int | None = None
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ValueError(f"{text!r}: the limit after % must be a whole number of 1 or more")
        limit = int(limit_text)
    indices: set[int] = set()
    for part in body.split(","):
        found = _RANGE.match(part.strip())
        if not found:
            raise ValueError(
                f"{text!r}: {part.strip()!r} is not an index or a range (e.g. 0-99%8, 1,3,5-7)"
            )
        first = int(found.group(1))
        last = int(found.group(2)) if found.group(2) is not None else first
        if last < first:
            raise ValueError(f"{text!r}: the range {part.strip()} ends before it starts")
        if last > MAX_ARRAY_INDEX:
            raise ValueError(f"{text!r}: indices go up to {MAX_ARRAY_INDEX}")
        if last - first + 1 + len(indices) > MAX_ARRAY_SIZE:
            raise ValueError(f"{text!r}: an array has at most {MAX_ARRAY_SIZE} members")
        indices.update(range(first, last + 1))
    return tuple(sorted(indices)), limit


def parse_dependency(text: str) -> Dependency:
    """`NAME`, `NAME:ok` or `NAME:any`; raises ValueError saying what is wrong."""
    name, _, condition = text.partition(":")
    condition = condition or "ok"
    if not name:
        raise ValueError(f"{text!r}: give the workload to wait for, as NAME[:ok|any]")
    if condition == "ok":
        return Dependency(name, "ok")
    if condition == "any":
        return Dependency(name, "any")
    raise ValueError(f"{text!r}: the condition is ok (succeeded) or any (ended), not {condition!r}")
