"""dead letters: tries before a requeue; how long each try waited in the queue (metrics)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 14:13:32.703544
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("tries_before", sa.Integer(), server_default=sa.text("0"), nullable=False)
        )
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("waited", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_column("waited")

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("tries_before")
