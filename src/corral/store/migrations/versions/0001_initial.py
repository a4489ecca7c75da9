"""The initial schema: queues, nodes and devices, workloads with task groups and
placements (with their task processes), events, users and tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-22 03:47:30.458706
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("workload", sa.String(length=63), nullable=True),
        sa.Column("node", sa.String(length=63), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("cause", sa.String(length=63), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_workload", ["workload"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("gpu_model", sa.String(length=63), nullable=False),
        sa.Column("gpu_memory", sa.BigInteger(), nullable=False),
        sa.Column("cpu", sa.Float(), nullable=False),
        sa.Column("memory", sa.BigInteger(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("schedulable", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("virtual", sa.Boolean(), nullable=False),
        sa.Column("address", sa.String(length=255), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "queues",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("deserved_gpu", sa.Float(), nullable=False),
        sa.Column("deserved_cpu", sa.Float(), nullable=True),
        sa.Column("deserved_memory", sa.BigInteger(), nullable=True),
        sa.Column("limit_gpu", sa.Float(), nullable=True),
        sa.Column("limit_cpu", sa.Float(), nullable=True),
        sa.Column("limit_memory", sa.BigInteger(), nullable=True),
        sa.Column("weight_gpu", sa.Float(), nullable=False),
        sa.Column("weight_cpu", sa.Float(), nullable=False),
        sa.Column("weight_memory", sa.Float(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["queues.id"], ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=63), nullable=False),
        sa.Column("memory", sa.BigInteger(), nullable=False),
        sa.Column("virtual", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node_id", "index"),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["queues.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("queue_id", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=63), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("min_available", sa.Integer(), nullable=True),
        sa.Column("node_selector", sa.JSON(), nullable=False),
        sa.Column("topology_key", sa.String(length=63), nullable=True),
        sa.Column("topology_required", sa.Boolean(), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("workdir", sa.Text(), nullable=True),
        sa.Column("max_runtime", sa.Float(), nullable=True),
        sa.Column("backoff_limit", sa.Integer(), nullable=False),
        sa.Column("grace_period", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["queue_id"], ["queues.id"], ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.create_index("ix_workloads_status", ["status"], unique=False)

    op.create_table(
        "placements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("task", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("gpu", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("proc_start", sa.BigInteger(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="RESTRICT"),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workload_id", "task"),
    )
    op.create_table(
        "task_groups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("gpu", sa.Float(), nullable=False),
        sa.Column("gpu_memory", sa.BigInteger(), nullable=False),
        sa.Column("cpu", sa.Float(), nullable=False),
        sa.Column("memory", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workload_id", "ordinal"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )


def downgrade() -> None:
    op.drop_table("tokens")
    op.drop_table("task_groups")
    op.drop_table("placements")
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index("ix_workloads_status")

    op.drop_table("workloads")
    op.drop_table("users")
    op.drop_table("devices")
    op.drop_table("queues")
    op.drop_table("nodes")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_workload")

    op.drop_table("events")
