"""events and waits: application events kept for the wait nodes that begin after them, and
the wait nodes' tries waiting for their event

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from conveyor.models.base import UTCDateTime

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("payload", _JSON, nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_events_correlation", "events", ["tenant_id", "name", "key", "created_at"])
    op.create_index("ix_events_expires_at", "events", ["expires_at"])
    op.create_table(
        "waits",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("execution_id", sa.Uuid(), nullable=False),
        sa.Column("node_id", sa.String(length=100), nullable=False),
        sa.Column("event", sa.String(length=200), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("since", UTCDateTime(timezone=True), nullable=False),
        sa.Column("timeout_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_waits_correlation", "waits", ["tenant_id", "event", "key"])
    op.create_index(
        "ix_waits_timeout_at",
        "waits",
        ["timeout_at"],
        postgresql_where=sa.text("timeout_at IS NOT NULL"),
        sqlite_where=sa.text("timeout_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_table("waits")
    op.drop_table("events")
