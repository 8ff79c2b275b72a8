"""api keys, webhook endpoints and deliveries, subscriptions, idempotency keys, and the
NOTIFY triggers behind live status streams

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 13:31:27.526175
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import conveyor.models.base

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Status changes of an execution and of its nodes are announced on a channel of that execution
# (`conveyor_execution_<id without dashes>`), so that a live stream listens to its own only.
NOTIFY_FUNCTIONS = """
CREATE FUNCTION conveyor_notify_execution() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
    PERFORM pg_notify('conveyor_execution_' || replace(NEW.id::text, '-', ''),
      json_build_object('kind', 'execution', 'status', NEW.status)::text);
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE FUNCTION conveyor_notify_node() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
    PERFORM pg_notify('conveyor_execution_' || replace(NEW.execution_id::text, '-', ''),
      json_build_object('kind', 'node', 'node_id', NEW.node_id, 'status', NEW.status)::text);
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER executions_notify AFTER INSERT OR UPDATE OF status ON executions
  FOR EACH ROW EXECUTE FUNCTION conveyor_notify_execution();
CREATE TRIGGER node_states_notify AFTER INSERT OR UPDATE OF status ON node_states
  FOR EACH ROW EXECUTE FUNCTION conveyor_notify_node();
"""
DROP_NOTIFY = """
DROP TRIGGER IF EXISTS node_states_notify ON node_states;
DROP TRIGGER IF EXISTS executions_notify ON executions;
DROP FUNCTION IF EXISTS conveyor_notify_node();
DROP FUNCTION IF EXISTS conveyor_notify_execution();
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite (embedded) streams by polling
        op.execute(NOTIFY_FUNCTIONS)

    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    op.create_table(
        "subscriptions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("workflow_name", sa.String(length=200), nullable=False),
        sa.Column(
            "kind",
            sa.Enum("event", "webhook", name="subscription_kind", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column(
            "events",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_subscriptions_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_subscriptions")),
    )
    with op.batch_alter_table("subscriptions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_subscriptions_source", ["tenant_id", "kind", "source"], unique=False
        )

    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column(
            "scheme",
            sa.Enum("standard", "github", name="signature_scheme", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("secret", sa.String(length=200), nullable=False),
        sa.Column("rejected", sa.Integer(), nullable=False),
        sa.Column("created_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_webhook_endpoints_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_endpoints")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_webhook_endpoints_tenant_id")),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("delivery_id", sa.String(length=200), nullable=False),
        sa.Column("event", sa.String(length=200), nullable=True),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "status",
            sa.Enum(
                "received",
                "processed",
                "unmatched",
                name="delivery_status",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("executions", sa.Integer(), nullable=False),
        sa.Column("received_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("processed_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name=op.f("fk_webhook_deliveries_endpoint_id_webhook_endpoints"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_webhook_deliveries_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint(
            "endpoint_id", "delivery_id", name=op.f("uq_webhook_deliveries_endpoint_id")
        ),
    )
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        batch_op.create_index(
            "uq_executions_idempotency",
            ["tenant_id", "idempotency_key"],
            unique=True,
            postgresql_where=sa.text("idempotency_key IS NOT NULL"),
            sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(DROP_NOTIFY)

    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_executions_idempotency",
            postgresql_where=sa.text("idempotency_key IS NOT NULL"),
            sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        )
        batch_op.drop_column("idempotency_key")

    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_endpoints")
    with op.batch_alter_table("subscriptions", schema=None) as batch_op:
        batch_op.drop_index("ix_subscriptions_source")

    op.drop_table("subscriptions")
    op.drop_table("api_keys")
