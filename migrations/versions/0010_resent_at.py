"""resent_at: when a sweep last re-sent a job's message as lost (once a lapse, not per sweep)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import conveyor.models.base

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds it without rewriting the table.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("resent_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("resent_at")
