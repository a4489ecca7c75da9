"""The one error the simulator raises for input it cannot use."""

from __future__ import annotations


class SimError(ValueError):
    """A trace, trace column, policy or project the simulator cannot use.

    `str(error)` is the one line shown to users; it names the file (or input) and, when
    there is one, the row or column: `philly.csv: column "duration" is absent`.
    """

    def __init__(self, source: str, problem: str, where: str = "") -> None:
        self.source = source
        self.where = where
        self.problem = problem
        place = f"{source}: {where}" if where else source
        super().__init__(f"{place}: {problem}" if place else problem)
