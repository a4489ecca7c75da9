"""Checkpoints and lost work: the newest checkpoint agents reported for each workload
(`workloads.checkpoint_at`), and what its latest preemption threw away (`preempted_at`,
`lost_gpu_seconds`, `lost_since`, `lost_since_checkpoint`).

All NULL on the rows that exist when this migration runs: no checkpoint known, never
preempted since corral kept count.

Revision ID: 0011_ckpt
Revises: 0006_ux
Create Date: 2026-11-23 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_ckpt"
down_revision: str | None = "0006_ux"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FLOATS = ("checkpoint_at", "preempted_at", "lost_gpu_seconds", "lost_since")


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        for name in _FLOATS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
        batch.add_column(sa.Column("lost_since_checkpoint", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("lost_since_checkpoint")
        for name in reversed(_FLOATS):
            batch.drop_column(name)
