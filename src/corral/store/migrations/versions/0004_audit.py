"""Audit and tokens: token names, expiry, revocation and last use; the audit log of
writes; the Idempotency-Key records of submissions.

Revision ID: 0003_audit
Revises: 0003
Create Date: 2026-11-23 17:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_audit"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("name", sa.String(length=63), nullable=True))
        batch.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("revoked_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("last_used_at", sa.Float(), nullable=True))
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("user", sa.String(length=63), nullable=True),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("route", sa.String(length=255), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_index("ix_audit_user_at", "audit", ["user", "at"])
    op.create_table(
        "idempotency",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("user", sa.String(length=63), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("workloads", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("user", "key"),
    )
    op.create_index("ix_idempotency_at", "idempotency", ["created_at"])


def downgrade() -> None:
    op.drop_table("idempotency")
    op.drop_table("audit")
    with op.batch_alter_table("tokens") as batch:
        for column in ("last_used_at", "revoked_at", "expires_at", "name"):
            batch.drop_column(column)
