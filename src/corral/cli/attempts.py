"""`corral describe`'s attempts: every run of a workload, where it ran and how it ended.

Each event of a run carries its attempt number (the API's `attempt`): the `bound` that
starts it, the task starts and ends, and the event that ends it. An elastic workload that
shrinks (a `preempted` event) or grows (a `bound`) goes on with the same attempt, so the
end of an attempt is its last ending event only once a later attempt has begun or the
workload no longer runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from corral.cli.common import format_when
from corral.sdk.types import EventOut, WorkloadOut

# The events that may end an attempt, with the outcome each means.
OUTCOMES = {
    "requeued": "requeued",
    "preempted": "preempted",
    "retrying": "failed, retried",
    "failed": "failed",
    "succeeded": "succeeded",
    "cancelled": "cancelled",
    "suspended": "suspended",
}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run: when it was bound and ended (None: it runs), the nodes its tasks were
    bound to, how it ended and why (the ending event's reason)."""

    number: int
    started: float
    ended: float | None
    nodes: tuple[str, ...]
    outcome: str
    cause: str

    def as_json(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["nodes"] = list(self.nodes)
        return fields


def attempts_of(workload: WorkloadOut, events: list[EventOut]) -> list[Attempt]:
    """The workload's attempts found in its events (`events`, oldest first), in order."""
    runs: dict[int, list[EventOut]] = {}
    for event in events:
        number = event.get("attempt")
        if number is not None:
            runs.setdefault(number, []).append(event)
    found = []
    for number, run in sorted(runs.items()):
        ends = [event for event in run if event["kind"] in OUTCOMES]
        over = number < workload["attempts"] or workload["status"] != "running"
        end = ends[-1] if over and ends else None
        nodes = tuple(dict.fromkeys(node for event in run for node in _nodes_of(event)))
        if end is None:
            outcome, cause = ("ended", "unknown") if over else ("running", "")
        else:
            outcome = OUTCOMES[end["kind"]]
            cause = end["reason"] or f"by {end['cause']}"
        ended = end["time"] if end is not None else None
        found.append(Attempt(number, run[0]["time"], ended, nodes, outcome, cause))
    return found


def _nodes_of(event: EventOut) -> list[str]:
    """The nodes an event names: its node, or those a `bound` event's reason lists ("2
    tasks on a, b", as corral.store.scheduling writes it)."""
    if event["kind"] == "bound":
        _, on, nodes = event["reason"].partition(" on ")
        return nodes.split(", ") if on else []
    return [event["node"]] if event["node"] else []


def attempts_json(attempts: list[Attempt]) -> list[dict[str, Any]]:
    return [attempt.as_json() for attempt in attempts]


def retries_line(workload: WorkloadOut) -> str:
    """How many of its retries the workload used: only its own failures count."""
    used, limit = workload.get("failures", 0), workload["backoff_limit"]
    return (
        f"{used} of {limit} used (only its own failures count; requeues after a lost or "
        "fenced node and preemptions do not)"
    )


def attempts_table(attempts: list[Attempt]) -> Table:
    """The attempts as `corral describe` shows them."""
    table = Table(title="Attempts", title_justify="left")
    for column in ("attempt", "started", "ended", "nodes", "outcome", "cause"):
        table.add_column(column)
    for attempt in attempts:
        table.add_row(
            str(attempt.number),
            format_when(attempt.started),
            format_when(attempt.ended),
            ", ".join(attempt.nodes) or "-",
            attempt.outcome,
            attempt.cause or "-",
        )
    return table
