"""execution trace context: the W3C traceparent and tracestate where an execution was
triggered (or a webhook delivery received), which its tries' spans join

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 02:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: executions made before have none, and their tries' trace is made
    # from their id (conveyor.tracing). Adding such a column rewrites no rows.
    op.add_column("executions", sa.Column("traceparent", sa.String(length=55), nullable=True))
    op.add_column("executions", sa.Column("tracestate", sa.String(length=512), nullable=True))
    for column in (
        sa.Column("traceparent", sa.String(55)),
        sa.Column("tracestate", sa.String(512)),
    ):
        op.add_column("webhook_deliveries", column)


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.drop_column("tracestate")
        batch.drop_column("traceparent")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("tracestate")
        batch.drop_column("traceparent")
