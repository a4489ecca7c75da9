"""Job history and lifecycle, arrays and dependencies: a workload's exit code, who
cancelled it, its array (name, index, running limit) and its dependencies.

Every column is nullable or has a default, so rows from before stay valid: they belong to
no array, wait for nothing, and their exit code is unknown.

Revision ID: 0006_life
Revises: 0006_launch
Create Date: 2026-11-23 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_life"
down_revision: str | None = "0006_launch"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Adding columns (nullable, or with a server default) does not rebuild the table on
    # SQLite.
    op.add_column("workloads", sa.Column("exit_code", sa.Integer(), nullable=True))
    op.add_column("workloads", sa.Column("cancelled_by", sa.String(length=63), nullable=True))
    op.add_column("workloads", sa.Column("array_name", sa.String(length=63), nullable=True))
    op.add_column("workloads", sa.Column("array_index", sa.Integer(), nullable=True))
    op.add_column("workloads", sa.Column("array_limit", sa.Integer(), nullable=True))
    op.add_column("workloads", sa.Column("after", sa.JSON(), nullable=True))
    for flag in ("kill_on_invalid_dep", "held"):
        op.add_column(
            "workloads",
            sa.Column(flag, sa.Boolean(), nullable=False, server_default=sa.false()),
        )
    op.create_index("ix_workloads_array", "workloads", ["array_name"])
    op.create_index("ix_workloads_held", "workloads", ["held"])


def downgrade() -> None:
    op.drop_index("ix_workloads_held", table_name="workloads")
    op.drop_index("ix_workloads_array", table_name="workloads")
    with op.batch_alter_table("workloads") as batch:
        for column in (
            "held",
            "kill_on_invalid_dep",
            "after",
            "array_limit",
            "array_index",
            "array_name",
            "cancelled_by",
            "exit_code",
        ):
            batch.drop_column(column)
