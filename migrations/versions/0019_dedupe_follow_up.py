"""executions.follow_up: the latest input a trigger with the same deduplication key left while
the execution was active (dedupe policy follow_up or replace), started when it finishes

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-26 04:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds it without rewriting the table.
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "follow_up",
                sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
                nullable=True,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_column("follow_up")
