"""Run the engine on a scenario, cycle after cycle, and record what happened."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from corral.engine import apply_decisions, schedule
from corral.model import Decisions, Placement, QueueStatus, Reservation
from corral.scenario.types import MAX_CYCLES, UNTIL_STABLE, Scenario

# Amounts are floats; rounding keeps 0.1 + 0.2 from printing as 0.30000000000000004.
_JSON_DECIMALS = 6


@dataclass(frozen=True, slots=True)
class WorkloadOutcome:
    """Where a workload ended: its running tasks (by task number), or pending and why."""

    placements: tuple[Placement, ...] = ()
    reason: str | None = None

    @property
    def status(self) -> Literal["running", "pending"]:
        return "running" if self.placements else "pending"

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(placement.node for placement in self.placements)

    @property
    def gpus(self) -> tuple[tuple[int, ...], ...]:
        """Device indices per running task; a fractional task lists the device it shares."""
        return tuple(placement.devices for placement in self.placements)


@dataclass(frozen=True, slots=True)
class EvictionRecord:
    """One eviction, in the cycle (counted from 1) in which it happened."""

    workload: str
    cycle: int
    action: str
    by: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class QueueOutcome:
    """A queue's GPUs as the last cycle saw them."""

    deserved: float
    fair_share: float
    allocated: float
    # The time-decayed over-quota GPU weight, where that policy is on.
    weight: float | None = None


@dataclass(frozen=True, slots=True)
class PlanResult:
    """What `plan` found: cycles run, final workload states, every eviction, final queues.

    `workloads` and `queues` keep the scenario's listing order. `pools`, when the scenario
    uses node pools, gives the queues in each pool. `reservations` are the last cycle's
    (backfill), by workload.
    """

    cycles: int
    workloads: Mapping[str, WorkloadOutcome]
    evictions: tuple[EvictionRecord, ...]
    queues: Mapping[str, QueueOutcome]
    pools: Mapping[str, Mapping[str, QueueOutcome]] = field(default_factory=dict)
    reservations: Mapping[str, Reservation] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The JSON document `corral plan FILE --json` prints, as plain Python values
        (with `pools` and `reservations` only when there are any)."""
        document: dict[str, object] = {
            "cycles": self.cycles,
            "workloads": {
                name: _workload_json(outcome) for name, outcome in self.workloads.items()
            },
            "evictions": [
                {
                    "workload": record.workload,
                    "cycle": record.cycle,
                    "action": record.action,
                    "by": record.by,
                    "reason": record.reason,
                }
                for record in self.evictions
            ],
            "queues": {name: _queue_json(queue) for name, queue in self.queues.items()},
        }
        if self.reservations:
            document["reservations"] = {
                name: {"nodes": list(held.nodes), "starts_in": held.starts_in}
                for name, held in self.reservations.items()
            }
        if self.pools:
            document["pools"] = {
                pool: {name: _queue_json(queue) for name, queue in queues.items()}
                for pool, queues in self.pools.items()
            }
        return document


def plan(scenario: Scenario) -> PlanResult:
    """Run the scheduler on the scenario's snapshot as its `run` section says.

    A fixed number of cycles runs exactly that many; until-stable stops after the first
    cycle that changes nothing, or after MAX_CYCLES. Pending reasons come from the last
    cycle, as do the queues.
    """
    until_stable = scenario.cycles == UNTIL_STABLE
    limit = scenario.cycles if isinstance(scenario.cycles, int) else MAX_CYCLES
    snapshot = scenario.snapshot
    evictions: list[EvictionRecord] = []
    cycle = 0
    decisions: Decisions | None = None
    while cycle < limit:
        cycle += 1
        decisions = schedule(snapshot, scenario.config)
        evictions.extend(
            EvictionRecord(eviction.workload, cycle, eviction.action, eviction.by, eviction.reason)
            for eviction in decisions.evictions
        )
        snapshot = apply_decisions(snapshot, decisions)
        if until_stable and not decisions.changed:
            break
    assert decisions is not None, "a scenario runs at least one cycle"

    evicted_last = {record.workload: record for record in evictions if record.cycle == cycle}
    workloads: dict[str, WorkloadOutcome] = {}
    for workload in snapshot.workloads:
        if workload.placements:
            placements = tuple(sorted(workload.placements, key=lambda placement: placement.task))
            workloads[workload.name] = WorkloadOutcome(placements)
        else:
            workloads[workload.name] = WorkloadOutcome(
                reason=_pending_reason(workload.name, decisions, evicted_last)
            )
    names = [queue.name for queue in scenario.snapshot.queues]
    pools = {pool: _outcomes(names, statuses) for pool, statuses in decisions.pools.items()}
    queues = _outcomes(names, decisions.queues)
    return PlanResult(cycle, workloads, tuple(evictions), queues, pools, decisions.reservations)


def _outcomes(names: list[str], statuses: Mapping[str, QueueStatus]) -> dict[str, QueueOutcome]:
    """The queues' GPUs as `statuses` give them, in the scenario's listing order."""
    return {
        name: QueueOutcome(
            deserved=status.deserved.gpu,
            fair_share=status.fair_share.gpu,
            allocated=status.allocated.gpu,
            weight=status.weight,
        )
        for name in names
        if (status := statuses.get(name)) is not None
    }


def _pending_reason(
    name: str, decisions: Decisions, evicted_last: Mapping[str, EvictionRecord]
) -> str:
    if name in decisions.pending:
        return decisions.pending[name]
    # A fixed run can end on the cycle that evicted the workload; the engine has not yet
    # had a cycle to say why it stays pending, so the eviction is the reason.
    if name in evicted_last:
        record = evicted_last[name]
        return f"evicted ({record.action}) in cycle {record.cycle}: {record.reason}"
    return "the scheduler gave no reason"


def _queue_json(queue: QueueOutcome) -> dict[str, object]:
    document: dict[str, object] = {
        "deserved": _json_number(queue.deserved),
        "fair_share": _json_number(queue.fair_share),
        "allocated": _json_number(queue.allocated),
    }
    # Only where time-decayed fair share is on, so that other plans print as they did.
    if queue.weight is not None:
        document["weight"] = _json_number(queue.weight)
    return document


def _workload_json(outcome: WorkloadOutcome) -> dict[str, object]:
    if outcome.status == "pending":
        return {"status": "pending", "reason": outcome.reason}
    return {
        "status": "running",
        "nodes": list(outcome.nodes),
        "gpus": [list(devices) for devices in outcome.gpus],
    }


def _json_number(value: float) -> int | float | None:
    """Whole amounts as ints; an unlimited amount as null, as in the scenario format."""
    if not math.isfinite(value):
        return None
    rounded = round(value, _JSON_DECIMALS)
    return int(rounded) if rounded == int(rounded) else rounded
