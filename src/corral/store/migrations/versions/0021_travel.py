"""What a workload brings to the node it lands on (docs/workloads.md): the digest of a code
snapshot of its project, the Python environment its node builds for it (the files that
say what to install, a Python version, index options, as JSON) and an OCI image; and, on
a placement, what its agent is preparing before the task starts ("building environment:
7 of 12 packages").

NULL on every row that exists when this migration runs: those workloads bring nothing,
and no task of theirs is being prepared.

Revision ID: 0021_travel
Revises: 0020_keys
Create Date: 2026-11-29 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_travel"
down_revision: str | None = "0020_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("code", sa.String(length=71), nullable=True))
        batch.add_column(sa.Column("python", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("image", sa.Text(), nullable=True))
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("preparing", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("preparing")
    with op.batch_alter_table("workloads") as batch:
        for column in ("image", "python", "code"):
            batch.drop_column(column)
