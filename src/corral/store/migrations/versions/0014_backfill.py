"""Queue reservations (backfill): how long the workload at the head of a queue waits
before it gets a reservation of the nodes where it fits soonest. NULL inherits the
parent's setting; with none set up the tree it is off, so existing queues keep today's
behaviour.

Revision ID: 0011_backfill
Revises: 0011_pools
Create Date: 2026-11-23 23:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_backfill"
down_revision: str | None = "0011_pools"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("reserve_after", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("reserve_after")
