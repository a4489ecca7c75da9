"""Each queue's decayed usage, for time-decayed fair share (docs/scheduling.md).

The scheduler loop calls `advance` on its clock: every queue where the policy is on (a
half-life set on it or above it) has a row holding its decayed GPU-seconds and the
cluster's, and `advance` adds what is bound now for the time since the row was last
brought up to date (`corral.model.usage.advance`, as the simulator does), so the
allocation between two calls counts as what was bound at the second. A queue whose
policy is turned off loses its row; one turned on starts with no history.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from corral.model.usage import DecayedUsage, advance, decay_settings
from corral.store.convert import queue_from_row
from corral.store.schema import PlacementRow, QueueRow, QueueUsageRow, WorkloadRow


def advance_usage(session: Session, now: float) -> dict[str, float]:
    """Bring every tracked queue's usage up to `now` with what is bound now; returns the
    usage shares by queue name (the snapshot's `usage`)."""
    rows = session.scalars(select(QueueRow).order_by(QueueRow.id)).all()
    names = {row.id: row.name for row in rows}
    settings = decay_settings([queue_from_row(row, names) for row in rows])
    ids = {row.name: row.id for row in rows}
    kept = {usage.queue_id: usage for usage in session.scalars(select(QueueUsageRow)).all()}
    tracked = {ids[name] for name in settings}
    gone = [queue_id for queue_id in kept if queue_id not in tracked]
    if gone:
        session.execute(delete(QueueUsageRow).where(QueueUsageRow.queue_id.in_(gone)))
    if not settings:
        return {}
    held = _held(session, {row.id: row.parent_id for row in rows})
    total = sum(held.get(row.id, 0.0) for row in rows if row.parent_id is None)
    shares: dict[str, float] = {}
    for name, setting in settings.items():
        queue_id = ids[name]
        row = kept.get(queue_id)
        if row is None:
            row = QueueUsageRow(
                queue_id=queue_id, gpu_seconds=0.0, cluster_gpu_seconds=0.0, updated_at=now
            )
            session.add(row)
        usage = advance(
            DecayedUsage(row.gpu_seconds, row.cluster_gpu_seconds),
            held.get(queue_id, 0.0),
            total,
            now - row.updated_at,
            setting.half_life,
        )
        row.gpu_seconds = usage.gpu_seconds
        row.cluster_gpu_seconds = usage.cluster_gpu_seconds
        row.updated_at = max(row.updated_at, now)
        shares[name] = usage.share
    return shares


def usage_shares(session: Session) -> dict[str, float]:
    """The usage shares as the last `advance_usage` left them, by queue name."""
    rows = session.execute(
        select(QueueRow.name, QueueUsageRow.gpu_seconds, QueueUsageRow.cluster_gpu_seconds).join(
            QueueRow, QueueRow.id == QueueUsageRow.queue_id
        )
    ).all()
    return {name: DecayedUsage(mine, cluster).share for name, mine, cluster in rows}


def _held(session: Session, parents: dict[int, int | None]) -> dict[int, float]:
    """GPUs bound now, by queue id, each queue counting its subtree's."""
    held: dict[int, float] = {}
    for queue_id, gpus in session.execute(
        select(WorkloadRow.queue_id, func.sum(PlacementRow.gpu))
        .join(WorkloadRow, PlacementRow.workload_id == WorkloadRow.id)
        .group_by(WorkloadRow.queue_id)
    ).all():
        level: int | None = queue_id
        seen: set[int] = set()
        while level is not None and level not in seen:
            seen.add(level)
            held[level] = held.get(level, 0.0) + float(gpus or 0.0)
            level = parents.get(level)
    return held
