"""webhook signatures: the GitHub bodies each endpoint received, so that a replay under a new
delivery id is refused

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import conveyor.models.base

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Deliveries received before this revision have no signature noted: a replay of one of
    # those is refused only by its delivery id.
    op.create_table(
        "webhook_signatures",
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("seen_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name=op.f("fk_webhook_signatures_endpoint_id_webhook_endpoints"),
        ),
        sa.PrimaryKeyConstraint("endpoint_id", "digest", name=op.f("pk_webhook_signatures")),
    )
    op.create_index("ix_webhook_signatures_seen_at", "webhook_signatures", ["seen_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_signatures_seen_at", table_name="webhook_signatures")
    op.drop_table("webhook_signatures")
