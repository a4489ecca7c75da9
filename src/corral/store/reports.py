"""What agents report (tasks started and ended, checkpoints, heartbeats), written many in
one transaction: at 1,000 nodes a transaction (an fsync) per report was the bottleneck."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from corral.store.nodes import heartbeats
from corral.store.records import Release
from corral.store.schema import WorkloadRow
from corral.store.tasks import bound_rows, placement_in, task_ended, task_started


@dataclass(frozen=True, slots=True)
class Started:
    """The task's process runs on `node`."""

    node: str
    workload: str
    task: int
    pid: int
    proc_start: int


@dataclass(frozen=True, slots=True)
class Ended:
    """The task's process on `node` is gone (see `Store.task_ended`)."""

    node: str
    workload: str
    task: int
    exit_code: int | None
    reason: str
    attempt: int | None = None
    launch: int | None = None
    # One of corral.messages.CAUSES when corral ended it; None: it ended by itself.
    cause: str | None = None
    # The name of its workload's directories (TaskLaunch.directory); None: not said.
    directory: str | None = None


@dataclass(frozen=True, slots=True)
class Beat:
    """The node's agent is alive."""

    node: str


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """The newest checkpoint of the workload's tasks on `node` was taken at `at` (Unix
    time), as the node's agent found it."""

    node: str
    workload: str
    at: float


Report = Started | Ended | Checkpointed | Beat
# A task stopped after its grace period may still be finishing a checkpoint it began then.
GRACE_SLACK = 5.0


@dataclass(slots=True)
class Outcome:
    """What a batch of reports asks of the caller."""

    # Started tasks that are no longer bound: their processes must stop.
    unbound: list[Started] = field(default_factory=list)
    # Sibling tasks of gangs whose task failed: stop them.
    releases: list[Release] = field(default_factory=list)
    # The workloads whose task ends were taken in (the scheduler has work to redo).
    ended: set[str] = field(default_factory=set)
    # An unavailable node is ready again.
    revived: bool = False
    # When the batch's transaction began, when it stops anything (see corral.messages).
    decided_at: float | None = None


def write_reports(session: Session, reports: Sequence[Report]) -> Outcome:
    """Take in `reports`, in order, in the caller's transaction."""
    outcome = Outcome()
    beats: set[str] = set()
    now = time.time()
    # Every workload reported on, read once; the reports change these same objects, so
    # each sees what the ones before it changed.
    rows = bound_rows(session, {r.workload for r in reports if not isinstance(r, Beat)})
    for report in reports:
        if isinstance(report, Started):
            if not task_started(
                session, report.workload, report.task, report.pid, report.proc_start, rows
            ):
                outcome.unbound.append(report)
        elif isinstance(report, Ended):
            placement = placement_in(rows.get(report.workload), report.task)
            if placement is not None and placement.node.name != report.node:
                # The end of a task stopped on a node it has left (moved by
                # consolidation, requeued when its node was lost): the task bound
                # elsewhere has not ended.
                continue
            outcome.releases.extend(
                task_ended(
                    session,
                    report.workload,
                    report.task,
                    report.exit_code,
                    report.reason,
                    report.attempt,
                    report.launch,
                    rows,
                    report.cause,
                    report.directory,
                )
            )
            outcome.ended.add(report.workload)
        elif isinstance(report, Checkpointed):
            checkpointed(rows.get(report.workload), report, now)
        else:
            beats.add(report.node)
    # All at once (a thousand nodes beat every few seconds): a beat changes only its
    # node's heartbeat and state, which no other report reads.
    if beats:
        outcome.revived = heartbeats(session, beats)
    return outcome


def checkpointed(row: WorkloadRow | None, report: Checkpointed, now: float) -> None:
    """Keep the newest checkpoint time of a workload that runs on the reporting node. The
    time comes from files the task writes, so it is never taken as later than now; only an
    agent that runs the workload speaks for it, and a checkpoint never goes back in time.
    Nothing the scheduler must act on at once: no generation moves (the next full read of
    the store sees it).

    A checkpoint taken in the grace period of the workload's latest preemption (as
    `corral.sdk.preemption` does on SIGTERM; its agent looks once more when the task ends)
    saved the work that preemption was recorded to lose: the record then says nothing was
    lost."""
    if row is None or not math.isfinite(report.at):
        return
    at = min(report.at, now)
    if row.checkpoint_at is not None and at <= row.checkpoint_at:
        return
    if row.status == "running":
        if any(placement.node.name == report.node for placement in row.placements):
            row.checkpoint_at = at
        return
    preempted = row.preempted_at
    if row.status != "pending" or preempted is None or row.lost_since is None:
        return
    if preempted <= at <= preempted + row.grace_period + GRACE_SLACK:
        row.checkpoint_at = at
        row.lost_gpu_seconds = 0.0
        row.lost_since = at
        row.lost_since_checkpoint = True
