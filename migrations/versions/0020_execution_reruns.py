"""execution_reruns: who re-ran a finished execution from which node, when, and the input
given to that node; executions.reruns counts them (a claim reads a rerun's input, and ready
nodes take their held jobs, only in an execution that has been re-run)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import conveyor.models.base

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "execution_reruns",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("execution_id", sa.Uuid(), nullable=False),
        sa.Column("from_node", sa.String(length=100), nullable=False),
        sa.Column(
            "input",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("requested_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["executions.id"],
            name=op.f("fk_execution_reruns_execution_id_executions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_execution_reruns")),
    )
    op.create_index(
        "ix_execution_reruns_execution", "execution_reruns", ["execution_id", "id"], unique=False
    )
    # With a constant default, PostgreSQL adds it without rewriting the table. The default is
    # a string, not sa.text("0"): batch mode copies an SQLite table to add a column whose
    # default is an expression, and the copy loses the stream triggers of 0017.
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reruns", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_column("reruns")
    op.drop_index("ix_execution_reruns_execution", table_name="execution_reruns")
    op.drop_table("execution_reruns")
