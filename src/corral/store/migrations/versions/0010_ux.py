"""When a workload last became pending (`workloads.pending_since`), so that a requeued
workload's wait counts from its requeue, not from its submission.

NULL, as on every row that exists when this migration runs, means pending since its
submission (`created_at`).

Revision ID: 0006_ux
Revises: 0006_sched
Create Date: 2026-11-23 19:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_ux"
down_revision: str | None = "0006_sched"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("pending_since", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("pending_since")
