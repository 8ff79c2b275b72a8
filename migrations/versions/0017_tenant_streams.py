"""stream_events: each change of an execution's status, written by a trigger, that the tenant
streams (GET /v1/stream) tell and replay from Last-Event-ID

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26 03:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import conveyor.models.base

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The writing transaction's id orders the events by when they can be seen: a reader takes
# only those below the oldest transaction still running (conveyor.api.tenant_stream).
POSTGRES = """
CREATE FUNCTION conveyor_stream_event() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
    INSERT INTO stream_events
      (txid, tenant_id, execution_id, workflow_id, dedupe_key, status, created_at)
    VALUES (pg_current_xact_id()::text::bigint, NEW.tenant_id, NEW.id, NEW.workflow_id,
      NEW.dedupe_key, NEW.status, now());
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER conveyor_stream_event AFTER INSERT OR UPDATE OF status ON executions
  FOR EACH ROW EXECUTE FUNCTION conveyor_stream_event();
"""
POSTGRES_DOWN = """
DROP TRIGGER IF EXISTS conveyor_stream_event ON executions;
DROP FUNCTION IF EXISTS conveyor_stream_event();
"""

# SQLite's writers take turns: the ids are in commit order, no transaction id is needed.
_SQLITE_INSERT = """
  INSERT INTO stream_events (tenant_id, execution_id, workflow_id, dedupe_key, status, created_at)
  VALUES (NEW.tenant_id, NEW.id, NEW.workflow_id, NEW.dedupe_key, NEW.status,
    strftime('%Y-%m-%d %H:%M:%f000', 'now'));
"""
SQLITE = [
    f"CREATE TRIGGER conveyor_stream_event_insert AFTER INSERT ON executions BEGIN"
    f"{_SQLITE_INSERT}END",
    f"CREATE TRIGGER conveyor_stream_event_update AFTER UPDATE OF status ON executions "
    f"WHEN NEW.status IS NOT OLD.status BEGIN{_SQLITE_INSERT}END",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS conveyor_stream_event_insert",
    "DROP TRIGGER IF EXISTS conveyor_stream_event_update",
]


def upgrade() -> None:
    op.create_table(
        "stream_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("txid", sa.BigInteger(), nullable=True),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("execution_id", sa.Uuid(), nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("dedupe_key", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["executions.id"],
            name=op.f("fk_stream_events_execution_id_executions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stream_events")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        op.f("ix_stream_events_execution_id"), "stream_events", ["execution_id"], unique=False
    )
    op.create_index("ix_stream_events_order", "stream_events", ["txid", "id"], unique=False)
    op.create_index(
        "ix_stream_events_tenant_order", "stream_events", ["tenant_id", "txid", "id"], unique=False
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(POSTGRES)
    else:
        for statement in SQLITE:
            op.execute(statement)


def downgrade() -> None:
    for statement in [POSTGRES_DOWN] if op.get_bind().dialect.name == "postgresql" else SQLITE_DOWN:
        op.execute(statement)
    op.drop_index("ix_stream_events_tenant_order", table_name="stream_events")
    op.drop_index("ix_stream_events_order", table_name="stream_events")
    op.drop_index(op.f("ix_stream_events_execution_id"), table_name="stream_events")
    op.drop_table("stream_events")
