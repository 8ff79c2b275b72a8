"""webhook endpoints that wake waits: the event name and the key (templates over a delivery)
under which an endpoint's deliveries are sent as application events

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-26 13:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.add_column(sa.Column("wakes_event", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("wakes_key", sa.String(length=500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.drop_column("wakes_key")
        batch.drop_column("wakes_event")
