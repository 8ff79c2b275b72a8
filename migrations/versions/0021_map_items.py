"""Run-time fan-out (map): a map's items are jobs (jobs.item_index, item, output), its node state
their counter (node_states.items_total, items_left, items_failed); one job a node of an
execution, and one an item; a partial index of the held items

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds them without rewriting the tables.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("item_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("item", _json(), nullable=True))
        batch_op.add_column(sa.Column("output", _json(), nullable=True))
    with op.batch_alter_table("node_states", schema=None) as batch_op:
        batch_op.add_column(sa.Column("items_total", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("items_left", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("items_failed", sa.Integer(), nullable=True))
    op.drop_index("uq_jobs_execution_node", table_name="jobs")
    op.create_index(
        "uq_jobs_execution_node",
        "jobs",
        ["execution_id", "node_id"],
        unique=True,
        postgresql_where=sa.text("node_id IS NOT NULL AND item_index IS NULL"),
        sqlite_where=sa.text("node_id IS NOT NULL AND item_index IS NULL"),
    )
    op.create_index(
        "uq_jobs_execution_node_item",
        "jobs",
        ["execution_id", "node_id", "item_index"],
        unique=True,
        postgresql_where=sa.text("item_index IS NOT NULL"),
        sqlite_where=sa.text("item_index IS NOT NULL"),
    )
    op.create_index(
        "ix_jobs_held",
        "jobs",
        ["execution_id", "node_id", "item_index"],
        postgresql_where=sa.text("status = 'held'"),
        sqlite_where=sa.text("status = 'held'"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_held", table_name="jobs")
    op.drop_index("uq_jobs_execution_node_item", table_name="jobs")
    op.drop_index("uq_jobs_execution_node", table_name="jobs")
    # (a map's item jobs would break the key restored below: the downgrade deletes them)
    op.execute("DELETE FROM jobs WHERE item_index IS NOT NULL")
    op.create_index(
        "uq_jobs_execution_node",
        "jobs",
        ["execution_id", "node_id"],
        unique=True,
        postgresql_where=sa.text("node_id IS NOT NULL"),
        sqlite_where=sa.text("node_id IS NOT NULL"),
    )
    with op.batch_alter_table("node_states", schema=None) as batch_op:
        batch_op.drop_column("items_failed")
        batch_op.drop_column("items_left")
        batch_op.drop_column("items_total")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("output")
        batch_op.drop_column("item")
        batch_op.drop_column("item_index")
