"""Names unique within a project: a workload submitted from now on is kept under its key,
PROJECT/NAME, so that two projects may each have a workload of one name and no answer
tells a member what another project named its work. The columns that hold a workload's
key grow from 63 characters to 127 (a project's name, "/", the workload's name). A
workload that exists when this migration runs keeps its bare name as its key (its running
tasks are known to their agents by it).

Revision ID: 0020_keys
Revises: 0019_sessions
Create Date: 2026-11-29 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_keys"
down_revision: str | None = "0019_sessions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, column) of every workload key.
KEYS = (
    ("workloads", "name"),
    ("workloads", "array_name"),
    ("events", "workload"),
    ("audit", "workload"),
    ("telemetry_raw", "workload"),
    ("telemetry_minute", "workload"),
    ("telemetry_hour", "workload"),
    ("allocations", "workload"),
)


def _resize(length: int) -> None:
    # SQLite keeps any length in any VARCHAR: its tables (telemetry's may be large) are
    # not copied for a length it does not enforce.
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in KEYS:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                column, type_=sa.String(length=length), existing_type=sa.String(length=63)
            )


def upgrade() -> None:
    _resize(127)


def downgrade() -> None:
    _resize(63)
