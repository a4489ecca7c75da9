"""Telemetry and accounting: raw samples, minute and hour rollups, their watermarks,
allocation intervals, and rules on queues.

Placements that exist when this migration runs get an open allocation interval from the
time they were bound, so that GPU-hours of work already running are not lost.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 10:00:00
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _sample_columns() -> list[sa.Column]:  # type: ignore[type-arg]
    return [
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("device", sa.Integer(), nullable=False),
        sa.Column("workload", sa.String(length=63), nullable=True),
        sa.Column("task", sa.Integer(), nullable=True),
        sa.Column("share", sa.Float(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
    ]


def _reading_columns() -> list[sa.Column]:  # type: ignore[type-arg]
    return [
        sa.Column("utilization", sa.Float(), nullable=False),
        sa.Column("memory_used", sa.BigInteger(), nullable=False),
        sa.Column("memory_total", sa.BigInteger(), nullable=False),
        sa.Column("power", sa.Float(), nullable=True),
        sa.Column("temperature", sa.Float(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "telemetry_raw",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("minute", sa.Float(), nullable=False),
        *_sample_columns(),
        *_reading_columns(),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("telemetry_raw", schema=None) as batch_op:
        batch_op.create_index("ix_telemetry_raw_time", ["time"], unique=False)
        batch_op.create_index("ix_telemetry_raw_minute", ["minute"], unique=False)
        batch_op.create_index("ix_telemetry_raw_workload", ["workload", "time"], unique=False)
        batch_op.create_index("ix_telemetry_raw_device", ["node", "device", "time"], unique=False)

    op.create_table(
        "telemetry_minute",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("minute", sa.Float(), nullable=False),
        sa.Column("hour", sa.Float(), nullable=False),
        *_sample_columns(),
        sa.Column("samples", sa.Integer(), nullable=False),
        *_reading_columns(),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("telemetry_minute", schema=None) as batch_op:
        batch_op.create_index("ix_telemetry_minute_minute", ["minute"], unique=False)
        batch_op.create_index("ix_telemetry_minute_hour", ["hour"], unique=False)
        batch_op.create_index("ix_telemetry_minute_workload", ["workload", "minute"], unique=False)

    op.create_table(
        "telemetry_hour",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hour", sa.Float(), nullable=False),
        *_sample_columns(),
        sa.Column("samples", sa.Integer(), nullable=False),
        *_reading_columns(),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("telemetry_hour", schema=None) as batch_op:
        batch_op.create_index("ix_telemetry_hour_hour", ["hour"], unique=False)
        batch_op.create_index("ix_telemetry_hour_workload", ["workload", "hour"], unique=False)

    op.create_table(
        "telemetry_state",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )

    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("placement_id", sa.Integer(), nullable=True),
        sa.Column("workload", sa.String(length=63), nullable=False),
        sa.Column("task", sa.Integer(), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=False),
        sa.Column("departments", sa.JSON(), nullable=False),
        sa.Column("user", sa.String(length=63), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("gpu", sa.Float(), nullable=False),
        sa.Column("start", sa.Float(), nullable=False),
        sa.Column("end", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.create_index("ix_allocations_open", ["end"], unique=False)
        batch_op.create_index("ix_allocations_start", ["start"], unique=False)
        batch_op.create_index("ix_allocations_placement", ["placement_id"], unique=False)
        batch_op.create_index("ix_allocations_workload", ["workload"], unique=False)

    with op.batch_alter_table("queues", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rules", sa.JSON(), nullable=True))

    _open_intervals_of_current_placements()


def _open_intervals_of_current_placements() -> None:
    bind = op.get_bind()
    queues = {
        row.id: (row.name, row.parent_id)
        for row in bind.execute(sa.text("SELECT id, name, parent_id FROM queues"))
    }
    rows = bind.execute(
        sa.text(
            "SELECT p.id, p.task, p.devices, p.gpu, p.created_at, w.name, w.queue_id, "
            'w."user", w.priority, n.name AS node '
            "FROM placements p JOIN workloads w ON p.workload_id = w.id "
            "JOIN nodes n ON p.node_id = n.id"
        )
    ).all()
    allocations = sa.table(
        "allocations",
        sa.column("placement_id", sa.Integer()),
        sa.column("workload", sa.String()),
        sa.column("task", sa.Integer()),
        sa.column("project", sa.String()),
        sa.column("departments", sa.JSON()),
        sa.column("user", sa.String()),
        sa.column("priority", sa.Integer()),
        sa.column("node", sa.String()),
        sa.column("devices", sa.JSON()),
        sa.column("gpu", sa.Float()),
        sa.column("start", sa.Float()),
        sa.column("end", sa.Float()),
    )
    values = []
    for row in rows:
        project, parent = queues[row.queue_id]
        departments = []
        while parent is not None:
            name, parent = queues[parent]
            departments.append(name)
        devices = json.loads(row.devices) if isinstance(row.devices, str) else row.devices
        values.append(
            {
                "placement_id": row.id,
                "workload": row.name,
                "task": row.task,
                "project": project,
                "departments": departments,
                "user": row.user,
                "priority": row.priority,
                "node": row.node,
                "devices": list(devices),
                "gpu": row.gpu,
                "start": row.created_at,
                "end": None,
            }
        )
    if values:
        op.bulk_insert(allocations, values)


def downgrade() -> None:
    with op.batch_alter_table("queues", schema=None) as batch_op:
        batch_op.drop_column("rules")
    for table, indexes in (
        (
            "allocations",
            (
                "ix_allocations_workload",
                "ix_allocations_placement",
                "ix_allocations_start",
                "ix_allocations_open",
            ),
        ),
        ("telemetry_state", ()),
        ("telemetry_hour", ("ix_telemetry_hour_workload", "ix_telemetry_hour_hour")),
        (
            "telemetry_minute",
            (
                "ix_telemetry_minute_workload",
                "ix_telemetry_minute_hour",
                "ix_telemetry_minute_minute",
            ),
        ),
        (
            "telemetry_raw",
            (
                "ix_telemetry_raw_device",
                "ix_telemetry_raw_workload",
                "ix_telemetry_raw_minute",
                "ix_telemetry_raw_time",
            ),
        ),
    ):
        if indexes:
            with op.batch_alter_table(table, schema=None) as batch_op:
                for index in indexes:
                    batch_op.drop_index(index)
        op.drop_table(table)
