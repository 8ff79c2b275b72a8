"""priority ageing and concurrency limits

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import conveyor.models.base

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_concurrency", sa.Integer(), nullable=True))

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("enqueued_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=True)
        )
    op.execute("UPDATE jobs SET enqueued_at = created_at")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.alter_column(
            "enqueued_at",
            existing_type=conveyor.models.base.UTCDateTime(timezone=True),
            nullable=False,
        )
        batch_op.create_index(
            "ix_jobs_parked",
            ["id"],
            unique=False,
            postgresql_where=sa.text("status = 'parked'"),
            sqlite_where=sa.text("status = 'parked'"),
        )
        batch_op.create_index(
            "ix_jobs_queued_low",
            ["enqueued_at"],
            unique=False,
            postgresql_where=sa.text("status = 'queued' AND priority = 'low'"),
            sqlite_where=sa.text("status = 'queued' AND priority = 'low'"),
        )


def downgrade() -> None:
    op.execute("UPDATE jobs SET status = 'queued' WHERE status = 'parked'")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_jobs_queued_low",
            postgresql_where=sa.text("status = 'queued' AND priority = 'low'"),
            sqlite_where=sa.text("status = 'queued' AND priority = 'low'"),
        )
        batch_op.drop_index(
            "ix_jobs_parked",
            postgresql_where=sa.text("status = 'parked'"),
            sqlite_where=sa.text("status = 'parked'"),
        )
        batch_op.drop_column("enqueued_at")

    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("max_concurrency")
