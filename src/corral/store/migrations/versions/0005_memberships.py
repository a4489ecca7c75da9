"""Memberships (a member in several projects, with a role in each) and project secrets
(encrypted values; a workload's `secrets` names those its tasks get).

Every user with a project (`users.project_id` of 0001) becomes a `member` of it. The
column itself stays, unused: dropping a column on SQLite rebuilds the table, and dropping
the old `users` table would cascade to `tokens`.

Revision ID: 0003_memberships
Revises: 0003_audit
Create Date: 2026-11-23 17:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_memberships"
down_revision: str | None = "0003_audit"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "memberships",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("queue_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["queue_id"], ["queues.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("user_id", "queue_id"),
    )
    op.execute(
        "INSERT INTO memberships (user_id, queue_id, role) "
        "SELECT id, project_id, 'member' FROM users WHERE project_id IS NOT NULL"
    )
    op.create_table(
        "secrets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("queue_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["queue_id"], ["queues.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("queue_id", "name"),
    )
    # Adding a nullable column does not rebuild the table on SQLite.
    op.add_column("workloads", sa.Column("secrets", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch_op:
        batch_op.drop_column("secrets")
    op.drop_table("secrets")
    op.drop_table("memberships")
