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

from conveyor.migrations import build_index

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds them without rewriting the tables. Only those
    # missing: the index builds below commit what precedes them, so a migration stopped
    # during them runs again from here with the columns there already.
    _add_missing("jobs", [
        sa.Column("item_index", sa.Integer(), nullable=True),
        sa.Column("item", _json(), nullable=True),
        sa.Column("output", _json(), nullable=True),
    ])  # fmt: skip
    _add_missing("node_states", [
        sa.Column("items_total", sa.Integer(), nullable=True),
        sa.Column("items_left", sa.Integer(), nullable=True),
        sa.Column("items_failed", sa.Integer(), nullable=True),
    ])  # fmt: skip
    # jobs is the largest table: on PostgreSQL each index is built concurrently, writes going
    # on meanwhile (build_index), and the node's key anew beside the old one, which goes
    # only then, so that one job a node is enforced throughout.
    build_index(
        "uq_jobs_execution_node_item", "jobs", ["execution_id", "node_id", "item_index"],
        unique=True, where="item_index IS NOT NULL",
    )  # fmt: skip
    build_index(
        "ix_jobs_held", "jobs", ["execution_id", "node_id", "item_index"],
        where="status = 'held'",
    )  # fmt: skip
    _rebuild_node_key()


def _add_missing(table: str, columns: list[sa.Column[object]]) -> None:
    present = {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}
    missing = [c for c in columns if c.name not in present]
    if missing:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in missing:
                batch_op.add_column(column)


def _rebuild_node_key() -> None:
    """uq_jobs_execution_node, one job a node, now leaving a map's items out of it."""
    key, new = "uq_jobs_execution_node", "node_id IS NOT NULL AND item_index IS NULL"
    if op.get_context().dialect.name != "postgresql":
        op.drop_index(key, table_name="jobs")
        op.create_index(key, "jobs", ["execution_id", "node_id"], unique=True,
                        sqlite_where=sa.text(new))  # fmt: skip
        return
    building = f"{key}_0021"
    build_index(building, "jobs", ["execution_id", "node_id"], unique=True, where=new)
    with op.get_context().autocommit_block():
        op.drop_index(key, table_name="jobs", postgresql_concurrently=True, if_exists=True)
        op.execute(f"ALTER INDEX {building} RENAME TO {key}")


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
