"""An index of placements by node. Reading one node's placements (its record, its
removal, the reconciler's work of some nodes, and the foreign key's check when a node's
row is deleted) scanned every placement: 1 ms per read at 20,000 placements on SQLite,
0.03 ms with it.

Revision ID: 0016_placements_node
Revises: 0015_changes
Create Date: 2026-11-27 18:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016_placements_node"
down_revision: str | None = "0015_changes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_placements_node", "placements", ["node_id"])


def downgrade() -> None:
    op.drop_index("ix_placements_node", table_name="placements")
