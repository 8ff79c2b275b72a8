"""executions.max_attempts and executions.timeout: limits given by a trigger for its execution,
overriding its definition's (NULL: the definition's)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26 03:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds them without rewriting the table.
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_attempts", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("timeout", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_column("timeout")
        batch_op.drop_column("max_attempts")
