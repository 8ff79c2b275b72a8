"""jobs: the queued jobs by priority and queue, for a continuation's look for a job of a
higher priority waiting (read at every continued step: without it, a backlog of queued jobs of
the same priority would be read through each time)

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-26 13:05:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_QUEUED = "status = 'queued'"


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_queued_priority",
            ["priority", "queue"],
            unique=False,
            postgresql_where=sa.text(_QUEUED),
            sqlite_where=sa.text(_QUEUED),
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_jobs_queued_priority",
            postgresql_where=sa.text(_QUEUED),
            sqlite_where=sa.text(_QUEUED),
        )
