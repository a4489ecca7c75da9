"""Each binding of a task gets a launch number: the end of a process stopped earlier
(an elastic workload's task evicted and bound again while the workload keeps running, so
keeps its attempt) is told apart from the end of the task bound now.

Revision ID: 0006_launch
Revises: 0003_memberships
Create Date: 2026-11-23 19:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_launch"
down_revision: str | None = "0003_memberships"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("launches", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("launch", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("launch")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("launches")
