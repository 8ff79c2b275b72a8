"""retention index on finished executions; status NOTIFYs only for executions streamed

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import conveyor.models.base

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The triggers of 0004 announced every status change, whether anyone listened or not; a
# NOTIFY takes a database-wide lock at commit. Now only executions with an open stream
# (a stream_listeners row) are announced.
LISTENED_NOTIFY = """
CREATE OR REPLACE FUNCTION conveyor_notify_execution() RETURNS trigger AS $$
BEGIN
  IF (TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status)
     AND EXISTS (SELECT 1 FROM stream_listeners WHERE execution_id = NEW.id) THEN
    PERFORM pg_notify('conveyor_execution_' || replace(NEW.id::text, '-', ''),
      json_build_object('kind', 'execution', 'status', NEW.status)::text);
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION conveyor_notify_node() RETURNS trigger AS $$
BEGIN
  IF (TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status)
     AND EXISTS (SELECT 1 FROM stream_listeners WHERE execution_id = NEW.execution_id) THEN
    PERFORM pg_notify('conveyor_execution_' || replace(NEW.execution_id::text, '-', ''),
      json_build_object('kind', 'node', 'node_id', NEW.node_id, 'status', NEW.status)::text);
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
"""

EVERY_NOTIFY = LISTENED_NOTIFY.replace(
    "\n     AND EXISTS (SELECT 1 FROM stream_listeners WHERE execution_id = NEW.id)", ""
).replace(
    "\n     AND EXISTS (SELECT 1 FROM stream_listeners WHERE execution_id = NEW.execution_id)", ""
)


def upgrade() -> None:
    op.create_table(
        "stream_listeners",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("execution_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stream_listeners")),
    )
    op.create_index(op.f("ix_stream_listeners_execution_id"), "stream_listeners", ["execution_id"])
    op.create_index(
        "ix_executions_finished",
        "executions",
        ["finished_at"],
        postgresql_where=sa.text("finished_at IS NOT NULL"),
        sqlite_where=sa.text("finished_at IS NOT NULL"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(LISTENED_NOTIFY)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(EVERY_NOTIFY)
    op.drop_index("ix_executions_finished", table_name="executions")
    op.drop_index(op.f("ix_stream_listeners_execution_id"), table_name="stream_listeners")
    op.drop_table("stream_listeners")
