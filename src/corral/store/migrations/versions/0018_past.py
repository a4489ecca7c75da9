"""A workload's past is its own: events are kept by the workload's id, not by its name,
so that a workload that takes a deleted one's name starts with no events, and each event
of a run names the attempt it belongs to (`corral describe` lists the attempts). Its
directories (logs, run files, its own directory) are named NAME.ID for the same reason.

`events.workload_id` is the id of the workload the event is about (NULL for events of
nodes, queues and users). Existing rows get the id of the workload that has their name now,
if it was submitted at or before the event: events of an earlier workload of the same
name (deleted since) stay without an id, as do those of workloads that are gone.
`events.attempt` is NULL on every existing row: which run an old event belonged to was
not recorded.

The index by workload name gives way to one by workload id: nothing reads by name now.

`workloads.dirs_by_name` is true for every workload that exists when this migration runs:
its directories keep its name alone (its running tasks write there, and are adopted
there after the upgrade); false, the default, for those submitted since (NAME.ID).

Revision ID: 0018_past
Revises: 0017_failing
Create Date: 2026-11-29 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_past"
down_revision: str | None = "0017_failing"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The submission of a workload and its "submitted" event have the same time.
FILL = """
UPDATE events SET workload_id = (
    SELECT workloads.id FROM workloads
    WHERE workloads.name = events.workload AND workloads.created_at <= events.time
)
WHERE events.workload IS NOT NULL
"""


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("workload_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
    op.execute(FILL)
    op.drop_index("ix_events_workload", table_name="events")
    op.create_index("ix_events_workload_id", "events", ["workload_id"])
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(
            sa.Column("dirs_by_name", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute(sa.text("UPDATE workloads SET dirs_by_name = :yes").bindparams(yes=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("dirs_by_name")
    op.drop_index("ix_events_workload_id", table_name="events")
    op.create_index("ix_events_workload", "events", ["workload"])
    with op.batch_alter_table("events") as batch:
        batch.drop_column("attempt")
        batch.drop_column("workload_id")
