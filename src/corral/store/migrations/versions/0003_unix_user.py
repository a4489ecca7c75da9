"""The Unix account each user's tasks run as on a root agent (`users.unix_user`).

Users that exist when this migration runs get the account of their own name, as a user
created afterwards does by default; the first user, `admin`, gets none (its tasks on a
root agent are refused until the operator names one with `--admin-unix-user`).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 16:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("unix_user", sa.String(length=32), nullable=True))
    op.execute("UPDATE users SET unix_user = name WHERE name != 'admin'")


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("unix_user")
