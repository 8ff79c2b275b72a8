"""Indexes for the executions listing's filters: by status, by workflow, by deduplication key
(active or not), and executions having a node in a status other than completed or skipped

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26 03:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain CREATE INDEX: it holds off writes to the table while it builds (on a large
    # executions table, expect about as long as reading the table once per index).
    op.create_index(
        "ix_executions_tenant_status_created", "executions", ["tenant_id", "status", "created_at"]
    )
    op.create_index(
        "ix_executions_tenant_workflow_created",
        "executions",
        ["tenant_id", "workflow_id", "created_at"],
    )
    op.create_index(
        "ix_executions_tenant_dedupe",
        "executions",
        ["tenant_id", "dedupe_key"],
        postgresql_where=sa.text("dedupe_key IS NOT NULL"),
        sqlite_where=sa.text("dedupe_key IS NOT NULL"),
    )
    op.create_index(
        "ix_node_states_unsettled",
        "node_states",
        ["status", "execution_id"],
        postgresql_where=sa.text("status NOT IN ('completed', 'skipped')"),
        sqlite_where=sa.text("status NOT IN ('completed', 'skipped')"),
    )


def downgrade() -> None:
    op.drop_index("ix_node_states_unsettled", table_name="node_states")
    op.drop_index("ix_executions_tenant_dedupe", table_name="executions")
    op.drop_index("ix_executions_tenant_workflow_created", table_name="executions")
    op.drop_index("ix_executions_tenant_status_created", table_name="executions")
