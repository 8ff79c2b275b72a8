"""cron schedules: the schedules table and the (schedule, slot) of scheduled runs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 13:15:48.280355
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import conveyor.models.base

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "schedules",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("workflow_name", sa.String(length=200), nullable=False),
        sa.Column(
            "origin",
            sa.Enum("definition", "manual", name="schedule_origin", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("cron", sa.String(length=200), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column(
            "input",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "priority",
            sa.Enum("high", "normal", "low", name="priority", native_enum=False, length=16),
            nullable=True,
        ),
        sa.Column(
            "misfire",
            sa.Enum("once", "skip", "all", name="misfire_policy", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("catch_up", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("next_run_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_run_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("run_count", sa.Integer(), nullable=False),
        sa.Column("created_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", conveyor.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_schedules_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_schedules_tenant_id")),
    )
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.create_index(
            "ix_schedules_due",
            ["next_run_at"],
            unique=False,
            postgresql_where=sa.text("enabled"),
            sqlite_where=sa.text("enabled"),
        )

    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("schedule_id", sa.Uuid(), nullable=True))
        batch_op.add_column(
            sa.Column(
                "scheduled_for", conveyor.models.base.UTCDateTime(timezone=True), nullable=True
            )
        )
        batch_op.create_index(
            "uq_executions_schedule_fire",
            ["schedule_id", "scheduled_for"],
            unique=True,
            postgresql_where=sa.text("schedule_id IS NOT NULL"),
            sqlite_where=sa.text("schedule_id IS NOT NULL"),
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_executions_schedule_id_schedules"),
            "schedules",
            ["schedule_id"],
            ["id"],
            ondelete="SET NULL",
        )


def downgrade() -> None:

    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_constraint(
            batch_op.f("fk_executions_schedule_id_schedules"), type_="foreignkey"
        )
        batch_op.drop_index(
            "uq_executions_schedule_fire",
            postgresql_where=sa.text("schedule_id IS NOT NULL"),
            sqlite_where=sa.text("schedule_id IS NOT NULL"),
        )
        batch_op.drop_column("scheduled_for")
        batch_op.drop_column("schedule_id")

    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_schedules_due", postgresql_where=sa.text("enabled"), sqlite_where=sa.text("enabled")
        )

    op.drop_table("schedules")
