"""executions.parent_execution_id, parent_node_id, parent_job_id, parent_try and depth: the
workflow node that started a child execution and waits for it, one child per (job, try)

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, or a constant default: PostgreSQL adds them without rewriting the table, and
    # SQLite with ALTER TABLE (a default given as SQL would make the batch rebuild the table,
    # dropping the stream events' triggers of 0017).
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_execution_id", sa.Uuid(), nullable=True))
        batch_op.add_column(sa.Column("parent_node_id", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("parent_job_id", sa.Uuid(), nullable=True))
        batch_op.add_column(sa.Column("parent_try", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("depth", sa.Integer(), server_default="0", nullable=False))
    # Partial: they hold children only (a plain CREATE INDEX still reads the table once).
    op.create_index(
        "uq_executions_parent_try",
        "executions",
        ["parent_job_id", "parent_try"],
        unique=True,
        postgresql_where=sa.text("parent_job_id IS NOT NULL"),
        sqlite_where=sa.text("parent_job_id IS NOT NULL"),
    )
    op.create_index(
        "ix_executions_parent_created",
        "executions",
        ["parent_execution_id", "created_at"],
        postgresql_where=sa.text("parent_execution_id IS NOT NULL"),
        sqlite_where=sa.text("parent_execution_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_executions_parent_created", table_name="executions")
    op.drop_index("uq_executions_parent_try", table_name="executions")
    # ALTER TABLE DROP COLUMN on both (SQLite 3.35 and later): a batch would rebuild the
    # table on SQLite and drop the stream events' triggers.
    for column in ("depth", "parent_try", "parent_job_id", "parent_node_id",
                   "parent_execution_id"):  # fmt: skip
        op.drop_column("executions", column)
