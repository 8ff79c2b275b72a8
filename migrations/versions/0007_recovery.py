"""recovery: job heartbeats, active-execution deduplication keys, recovery counts

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22 14:26:18.728086
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import conveyor.models.base

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "recovery_counts",
        sa.Column("what", sa.String(length=32), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("what", name=op.f("pk_recovery_counts")),
    )
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dedupe_key", sa.String(length=200), nullable=True))
        batch_op.create_index(
            "uq_executions_active_dedupe",
            ["tenant_id", "dedupe_key"],
            unique=True,
            postgresql_where=sa.text("dedupe_key IS NOT NULL AND status IN ('pending', 'running')"),
            sqlite_where=sa.text("dedupe_key IS NOT NULL AND status IN ('pending', 'running')"),
        )

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "heartbeat_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=True
            )
        )
        batch_op.create_index(
            "ix_jobs_processing_heartbeat",
            ["heartbeat_at"],
            unique=False,
            postgresql_where=sa.text("status = 'processing'"),
            sqlite_where=sa.text("status = 'processing'"),
        )
    # Jobs running during the upgrade count from their claim.
    op.execute("UPDATE jobs SET heartbeat_at = processed_at WHERE status = 'processing'")


def downgrade() -> None:

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_jobs_processing_heartbeat",
            postgresql_where=sa.text("status = 'processing'"),
            sqlite_where=sa.text("status = 'processing'"),
        )
        batch_op.drop_column("heartbeat_at")

    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_executions_active_dedupe",
            postgresql_where=sa.text("dedupe_key IS NOT NULL AND status IN ('pending', 'running')"),
            sqlite_where=sa.text("dedupe_key IS NOT NULL AND status IN ('pending', 'running')"),
        )
        batch_op.drop_column("dedupe_key")

    op.drop_table("recovery_counts")
