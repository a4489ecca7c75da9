"""The names of the policies a simulation compares, apart from their code, so that the
CLI can list them without loading the engine and numpy (corral.sim.policies says what
each one does)."""

from __future__ import annotations

# The placement scorers of corral.sim.packing, in the order they are listed.
SCORER_NAMES = ("random", "bestfit", "packing", "dotprod")
POLICIES = ("corral", "static", "fifo", *SCORER_NAMES)
