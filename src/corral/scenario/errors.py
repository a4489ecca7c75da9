"""The one error a bad scenario file raises, and the field-level problem it is built from."""

from __future__ import annotations


class ScenarioError(ValueError):
    """A scenario file that cannot be used: names the file, the field path and the problem.

    `str(error)` is the one line shown to users, for example
    `S.yaml: workloads[3].tasks: "2xA" is not REPLICASxGPUS`.
    """

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = problem
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {problem}")


class FieldError(Exception):
    """A problem at one field path, raised while reading a document.

    The reader does not know the file it came from; `parse_scenario` adds the file name
    when it turns this into a ScenarioError.
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
