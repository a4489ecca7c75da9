"""A gang's verdict waits for its nodes: when a task of a workload ends by itself with a
non-zero code while a task of the same workload runs on a node that has not been heard
from since, whether that was the workload's own failure (counted against its retries) or
the doing of a lost node (requeued, not counted) is decided only once that node answers
or is declared lost. `workloads.failing_since` is when the first such end was taken in,
`failing_reason` what ended; both NULL when no verdict waits.

NULL on every row that exists when this migration runs: nothing waits.

Revision ID: 0017_failing
Revises: 0016_placements_node
Create Date: 2026-11-28 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_failing"
down_revision: str | None = "0016_placements_node"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("failing_since", sa.Float(), nullable=True))
        batch.add_column(sa.Column("failing_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("failing_reason")
        batch.drop_column("failing_since")
