"""ix_executions_active_children: the children still pending or running, oldest first, where
a stop's later transactions (and the recovery sweep) find those their parent no longer waits for

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from conveyor.migrations import build_index

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE_CHILD = "parent_execution_id IS NOT NULL AND status IN ('pending', 'running')"


def upgrade() -> None:
    # executions is large: PostgreSQL builds it concurrently, writes going on meanwhile.
    build_index("ix_executions_active_children", "executions", ["created_at"], where=ACTIVE_CHILD)


def downgrade() -> None:
    op.drop_index("ix_executions_active_children", table_name="executions")
