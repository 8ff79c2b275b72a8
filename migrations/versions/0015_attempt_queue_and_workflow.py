"""job_attempts.queue and job_attempts.workflow_id: the job's, copied by the claim, so that the
metrics add the tries up by queue and workflow without joining each try to its job

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds them without rewriting the table; the backfill
    # below then writes every try once (one UPDATE: on a large job_attempts, expect it to take
    # about as long as copying the table).
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("workflow_id", sa.Uuid(), nullable=True))
    attempts = sa.table(
        "job_attempts", sa.column("job_id", sa.Uuid()), sa.column("queue", sa.String()),
        sa.column("workflow_id", sa.Uuid()),
    )  # fmt: skip
    jobs = sa.table(
        "jobs", sa.column("id", sa.Uuid()), sa.column("queue", sa.String()),
        sa.column("workflow_id", sa.Uuid()),
    )  # fmt: skip
    if op.get_bind().dialect.name == "postgresql":
        statement = (
            sa.update(attempts)
            .where(jobs.c.id == attempts.c.job_id)
            .values(queue=jobs.c.queue, workflow_id=jobs.c.workflow_id)
        )
    else:  # SQLite: a correlated subquery per column

        def of_job(column: sa.ColumnClause[object]) -> sa.ScalarSelect[object]:
            return sa.select(column).where(jobs.c.id == attempts.c.job_id).scalar_subquery()

        statement = sa.update(attempts).values(
            queue=of_job(jobs.c.queue), workflow_id=of_job(jobs.c.workflow_id)
        )
    op.execute(statement)


def downgrade() -> None:
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_column("workflow_id")
        batch_op.drop_column("queue")
