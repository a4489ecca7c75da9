"""The journal of changes that scheduling depends on, in the database: one row per such
change, numbered (the store's generation), with the names of the only workloads it
touched (NULL: it may have touched anything). Kept in memory by one server process
before, it is shared now by every process that writes the store (the API and the
scheduler); a store from before starts at generation 0.

Revision ID: 0015_changes
Revises: 0011_backfill
Create Date: 2026-11-27 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_changes"
down_revision: str | None = "0011_backfill"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "changes",
        sa.Column("generation", sa.BigInteger(), autoincrement=False, primary_key=True),
        sa.Column("touched", sa.JSON(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("changes")
