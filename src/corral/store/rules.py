"""Rules that act on utilisation, set per queue and per workload class.

A queue's `rules` map a workload class to limits in seconds:

    {"build": {"idle_timeout": 1800, "max_runtime": null}, "train": {"max_runtime": 86400}}

- idle_timeout: a running workload whose GPUs have all been at 0% this long is suspended;
- max_runtime: a workload running this long since it was last bound is stopped as failed.

A workload's class follows from its priority: train (50), build-preemptible (75), build
(100; "interactive" is another name for it) and inference (125); a priority between two
classes belongs to the lower one. A rule set on a department applies to every project
under it that does not set the same rule itself: the nearest queue decides.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from corral.model import CLASS_ALIASES, PRIORITY_CLASSES, WORKLOAD_CLASSES
from corral.model.durations import format_duration, parse_duration
from corral.store.convert import workload_record
from corral.store.database import Database
from corral.store.errors import Invalid
from corral.store.events import add_event, add_workload_event, run_of
from corral.store.queues import queue_row
from corral.store.records import Release, WorkloadRecord
from corral.store.schema import QueueRow, WorkloadRow
from corral.store.tasks import releases, stamped
from corral.store.telemetry import FRESH
from corral.store.telemetry_reads import idle_since
from corral.store.telemetry_schema import AllocationRow

FIELDS = ("idle_timeout", "max_runtime")
RuleSet = dict[str, dict[str, float | None]]


def workload_class(priority: int) -> str:
    """The class of a workload of this priority: the highest class at or below it."""
    chosen = WORKLOAD_CLASSES[0]
    for name in WORKLOAD_CLASSES:
        if PRIORITY_CLASSES[name] <= priority:
            chosen = name
    return chosen


def normalize_rules(rules: Mapping[str, Any] | None) -> RuleSet:
    """Rules with aliases resolved and every limit in seconds (or None: no limit). Raises
    Invalid naming the field, e.g. `rules.build.idle_timeout`."""
    result: RuleSet = {}
    if rules is None:
        return result
    if not isinstance(rules, Mapping):
        raise Invalid("rules", "must be an object keyed by workload class")
    for given, limits in rules.items():
        name = CLASS_ALIASES.get(given, given)
        if name not in WORKLOAD_CLASSES:
            known = ", ".join([*WORKLOAD_CLASSES, *CLASS_ALIASES])
            raise Invalid(f"rules.{given}", f"{given!r} is not a workload class ({known})")
        if name in result:
            raise Invalid(f"rules.{given}", f"{given!r} and {name!r} name the same class")
        if limits is None:
            limits = {}
        if not isinstance(limits, Mapping):
            raise Invalid(f"rules.{given}", "must be an object with idle_timeout, max_runtime")
        entry: dict[str, float | None] = {}
        for field, value in limits.items():
            if field not in FIELDS:
                raise Invalid(f"rules.{given}.{field}", f"unknown rule; known: {', '.join(FIELDS)}")
            entry[field] = None if value is None else _seconds(f"rules.{given}.{field}", value)
        result[name] = {field: entry.get(field) for field in FIELDS}
    return result


def _seconds(field: str, value: Any) -> float:
    try:
        return parse_duration(value)
    except ValueError as error:
        raise Invalid(field, str(error)) from None


def set_rules(store: Database, queue: str, rules: Mapping[str, Any] | None) -> RuleSet:
    """Replace a queue's rules (None or {} removes them); returns them normalized."""
    normalized = normalize_rules(rules)
    with store.write() as session:
        replace_rules(session, queue, normalized)
    return normalized


def replace_rules(session: Session, queue: str, normalized: RuleSet) -> None:
    """Replace a queue's rules with `normalized` ones (see `normalize_rules`), in the
    caller's transaction."""
    row = queue_row(session, queue)
    row.rules = normalized or None
    add_event(session, "queue-updated", "api", f"queue {queue} rules: {_describe(normalized)}")


def queue_rules(store: Database, queue: str) -> RuleSet:
    """The rules set on the queue itself (not inherited), normalized."""
    with store.read() as session:
        return dict(queue_row(session, queue).rules or {})


def _describe(rules: RuleSet) -> str:
    parts = []
    for name, limits in sorted(rules.items()):
        given = [f"{field}={format_duration(value)}" for field, value in limits.items() if value]
        parts.append(f"{name}({', '.join(given) or 'none'})")
    return "; ".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class Rule:
    """One limit that applies to a workload, and the queue that set it."""

    field: str
    seconds: float
    queue: str
    workload_class: str


def rule_for(
    queues: Mapping[str, tuple[str | None, RuleSet]], project: str, klass: str, field: str
) -> Rule | None:
    """The nearest queue, from `project` up, that sets `field` for `klass`."""
    current: str | None = project
    while current is not None and current in queues:
        parent, rules = queues[current]
        value = rules.get(klass, {}).get(field)
        if value:
            return Rule(field, value, current, klass)
        current = parent
    return None


@dataclass(frozen=True, slots=True)
class Enforced:
    """A workload a rule stopped: what it held (to stop its processes) and why."""

    record: WorkloadRecord
    rule: Rule
    reason: str
    # Its tasks to stop, stamped with the time the transaction that stopped them began.
    releases: list[Release]


def enforce_rules(store: Database, now: float | None = None) -> list[Enforced]:
    """Suspend running workloads idle past their idle timeout, and stop as failed those
    running past their maximum runtime. One transaction; returns what was done."""
    now = time.time() if now is None else now
    done: list[Enforced] = []
    with store.read() as session:
        # Most clusters set no rules: then the write lock is not even taken.
        if not any(session.scalars(select(QueueRow.rules)).all()):
            return done
    with store.write() as session:
        decided = time.time()
        queue_rows = session.scalars(select(QueueRow)).all()
        names = {row.id: row.name for row in queue_rows}
        queues = {
            row.name: (names.get(row.parent_id) if row.parent_id else None, row.rules or {})
            for row in queue_rows
        }
        running = session.scalars(
            select(WorkloadRow)
            .where(WorkloadRow.status == "running")
            .options(selectinload(WorkloadRow.placements), selectinload(WorkloadRow.task_groups))
            .order_by(WorkloadRow.id)
        ).all()
        wanted: list[tuple[WorkloadRow, Rule | None, Rule | None]] = []
        for row in running:
            project = names[row.queue_id]
            klass = workload_class(row.priority)
            idle = rule_for(queues, project, klass, "idle_timeout")
            longest = rule_for(queues, project, klass, "max_runtime")
            if idle or longest:
                wanted.append((row, idle, longest))
        if not wanted:
            return done
        bound_since: dict[str, float] = {}
        for name, start in session.execute(
            select(AllocationRow.workload, AllocationRow.start).where(
                AllocationRow.end.is_(None),
                AllocationRow.workload.in_([row.name for row, _, _ in wanted]),
            )
        ).all():
            bound_since[name] = min(start, bound_since.get(name, start))
        lookback = max((rule.seconds for _, rule, _ in wanted if rule), default=0.0) + FRESH
        quiet = idle_since(session, now, lookback) if lookback > FRESH else {}
        for row, idle, longest in wanted:
            project = names[row.queue_id]
            started = bound_since.get(row.name)
            if longest is not None and started is not None and now - started >= longest.seconds:
                reason = (
                    f"ran for {format_duration(now - started)}, past the maximum runtime of "
                    f"{format_duration(longest.seconds)} (rule of queue {longest.queue} for "
                    f"{longest.workload_class} work)"
                )
                done.append(_enforced(row, project, longest, reason, decided))
                _stop(session, row, "failed", "max-runtime", reason, now)
                continue
            since = quiet.get(row.name)
            if since is not None and row.active_at is not None:
                # A workspace is idle only once its proxy traffic has stopped too.
                since = max(since, row.active_at)
            if idle is not None and since is not None and now - since >= idle.seconds:
                reason = (
                    f"GPUs idle for {format_duration(idle.seconds)} (rule of queue "
                    f"{idle.queue} for {idle.workload_class} work)"
                )
                done.append(_enforced(row, project, idle, reason, decided))
                _stop(session, row, "suspended", "idle-timeout", reason, now)
    return done


def _enforced(row: WorkloadRow, project: str, rule: Rule, reason: str, decided: float) -> Enforced:
    """What `rule` does to `row`, taken before its placements go."""
    stopping = releases(row, {placement.task for placement in row.placements}, reason)
    return Enforced(workload_record(row, project), rule, reason, stamped(stopping, decided))


def _stop(
    session: Session, row: WorkloadRow, status: str, cause: str, reason: str, now: float
) -> None:
    attempt = run_of(row)
    row.placements.clear()
    row.status = status
    row.reason = reason
    if status == "failed":
        row.finished_at = now
    add_workload_event(session, row, status, cause, reason, attempt=attempt)
