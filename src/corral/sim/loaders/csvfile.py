"""Reading trace CSV files with errors that name the file, the row and the column."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

from corral.sim.errors import SimError


class Row:
    """One data row; typed getters raise SimError naming the row and column."""

    __slots__ = ("_line", "_source", "_values")

    def __init__(self, source: str, line: int, values: dict[str, str]) -> None:
        self._source = source
        self._line = line
        self._values = values

    def text(self, column: str) -> str:
        return (self._values.get(column) or "").strip()

    def number(self, column: str) -> float:
        raw = self.text(column)
        try:
            value = float(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not a number") from None
        if not math.isfinite(value):
            raise self.error(column, f"{raw!r} is not a finite number")
        return value

    def optional_number(self, column: str) -> float | None:
        return self.number(column) if self.text(column) else None

    def error(self, column: str, problem: str) -> SimError:
        return SimError(self._source, problem, f"line {self._line}, column {column!r}")


def read_rows(path: Path, required: Sequence[str], optional: Sequence[str] = ()) -> Iterator[Row]:
    """The data rows of a CSV file with a header; every `required` column must be there."""
    source = path.name
    try:
        handle = path.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise SimError(str(path), "no such file") from None
    except OSError as error:
        raise SimError(str(path), f"cannot read the file: {error.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        absent = [column for column in required if column not in header]
        if absent:
            names = ", ".join(repr(column) for column in absent)
            noun = "column" if len(absent) == 1 else "columns"
            verb = "is" if len(absent) == 1 else "are"
            raise SimError(source, f"{noun} {names} {verb} absent (it has {', '.join(header)})")
        wanted = [*required, *(column for column in optional if column in header)]
        for line, values in enumerate(reader, start=2):
            yield Row(source, line, {column: values.get(column) or "" for column in wanted})
