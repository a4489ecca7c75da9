"""Node pools: a queue's quotas by pool, and the pools a workload may run in, in order of
preference. NULL is none: a queue's quota stays its deserved and limit (the default pool)
and a workload may run in any pool, so existing rows keep today's behaviour.

Revision ID: 0011_pools
Revises: 0011_tfs
Create Date: 2026-11-23 22:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_pools"
down_revision: str | None = "0011_tfs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("pools", sa.JSON(), nullable=True))
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("node_pools", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("node_pools")
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("pools")
