"""Sessions in the audit log: an exec, shell or port-forward session entering a workload's
task is a row of `audit` (method EXEC or FORWARD, status 101 once it opened, or the status
it was refused with), with the workload and task it entered, the command it ran, when it
ended and the command's exit code.

NULL on every row that exists when this migration runs: they are write requests.

Revision ID: 0019_sessions
Revises: 0018_past
Create Date: 2026-11-30 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_sessions"
down_revision: str | None = "0018_past"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.add_column(sa.Column("workload", sa.String(length=63), nullable=True))
        batch.add_column(sa.Column("task", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("command", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("ended_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("exit_code", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        for column in ("exit_code", "ended_at", "command", "task", "workload"):
            batch.drop_column(column)
