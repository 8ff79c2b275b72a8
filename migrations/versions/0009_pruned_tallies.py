"""pruned tallies: what the retention sweep deleted, added up for the metrics of tries ever

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Tries pruned before this revision are not counted: the counters start from what the
    # tables hold now, as they read before the upgrade.
    op.create_table(
        "pruned_tallies",
        sa.Column("what", sa.String(length=64), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("what", name=op.f("pk_pruned_tallies")),
    )


def downgrade() -> None:
    op.drop_table("pruned_tallies")
