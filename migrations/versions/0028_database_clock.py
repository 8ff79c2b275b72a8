"""executions.events_since: the database's own clock when the execution was inserted
(PostgreSQL's statement_timestamp(), its column default), from which its waits take the
events kept for them; on PostgreSQL an event's created_at is that clock's too. Stamped by the
processes' own clocks, a sender whose clock lagged the trigger's lost its wake-up.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-26 15:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from conveyor.models.base import UTCDateTime

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable and no default at first, so that PostgreSQL adds it without rewriting the
    # table and the executions before it keep NULL (their waits count from created_at, as
    # before) instead of this migration's time, which would refuse the events kept for the
    # ones running. Then the default, for the rows inserted from now on. SQLite (one machine,
    # one clock) keeps NULL: ALTER TABLE, no batch (a batch would rebuild the table and drop
    # the stream events' triggers of 0017).
    op.add_column("executions", sa.Column("events_since", UTCDateTime(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "executions", "events_since", server_default=sa.text("statement_timestamp()")
        )


def downgrade() -> None:
    op.drop_column("executions", "events_since")
