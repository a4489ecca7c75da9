"""Queue min-runtimes: how long a workload must have run before preemption or reclaim may
take it. NULL inherits the parent's setting; with none set up the tree it is off, so
existing queues keep today's behaviour.

Revision ID: 0006_sched
Revises: 0006_ws
Create Date: 2026-11-23 19:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_sched"
down_revision: str | None = "0006_ws"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("preempt_min_runtime", sa.Float(), nullable=True))
        batch.add_column(sa.Column("reclaim_min_runtime", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("reclaim_min_runtime")
        batch.drop_column("preempt_min_runtime")
