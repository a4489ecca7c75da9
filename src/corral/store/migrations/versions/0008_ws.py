"""Workspaces: the ports a workload declares, the numbers its tasks were given, and when
the proxy last carried its traffic. All nullable: older rows declare no ports.

Revision ID: 0006_ws
Revises: 0006_life
Create Date: 2026-11-23 19:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_ws"
down_revision: str | None = "0006_life"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("ports", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("active_at", sa.Float(), nullable=True))
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("ports", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("ports")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("active_at")
        batch.drop_column("ports")
