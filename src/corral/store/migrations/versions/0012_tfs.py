"""Time-decayed fair share: per-queue `fair_share_half_life` and `fair_share_k` (NULL
inherits the parent's; with no half-life up the tree the policy is off, so existing
queues keep today's behaviour), and the `queue_usage` table, each queue's decayed usage
kept by the scheduler loop.

Revision ID: 0011_tfs
Revises: 0011_ckpt
Create Date: 2026-11-23 22:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_tfs"
down_revision: str | None = "0011_ckpt"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("fair_share_half_life", sa.Float(), nullable=True))
        batch.add_column(sa.Column("fair_share_k", sa.Float(), nullable=True))
    op.create_table(
        "queue_usage",
        sa.Column(
            "queue_id",
            sa.Integer(),
            sa.ForeignKey("queues.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("gpu_seconds", sa.Float(), nullable=False, server_default="0"),
        sa.Column("cluster_gpu_seconds", sa.Float(), nullable=False, server_default="0"),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("queue_usage")
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("fair_share_k")
        batch.drop_column("fair_share_half_life")
