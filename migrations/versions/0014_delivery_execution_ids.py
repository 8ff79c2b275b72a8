"""webhook_deliveries.execution_ids: the executions a delivery started, so that a repeat of its
delivery id is answered with them (2xx) instead of a 409 its sender would retry

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 02:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds it without rewriting the table. Deliveries handled
    # before keep NULL, answered as "not recorded".
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "execution_ids",
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_column("execution_ids")
