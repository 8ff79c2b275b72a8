"""alert state

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 14:19:10.072043
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import conveyor.models.base

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "alert_state",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("evaluated_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column(
            "counters",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "firing",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_state")),
    )


def downgrade() -> None:

    op.drop_table("alert_state")
