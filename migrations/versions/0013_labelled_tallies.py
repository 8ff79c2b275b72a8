"""pruned_tallies.what up to 300 characters: the histograms' tallies name their labels (a queue
and a workflow name of up to 200 characters)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A longer varchar: PostgreSQL changes the catalog only, without rewriting the table.
    with op.batch_alter_table("pruned_tallies", schema=None) as batch_op:
        batch_op.alter_column(
            "what", existing_type=sa.String(length=64), type_=sa.String(length=300)
        )


def downgrade() -> None:
    # Labelled rows would not fit: each is added to its row without labels, then deleted.
    tallies = sa.table(
        "pruned_tallies", sa.column("what", sa.String), sa.column("count", sa.BigInteger),
        sa.column("total", sa.Float),
    )  # fmt: skip
    bind = op.get_bind()
    folded: dict[str, tuple[int, float]] = {}
    for what, count, total in bind.execute(sa.select(tallies)).all():
        before = folded.get(what.split("|")[0], (0, 0.0))
        folded[what.split("|")[0]] = (before[0] + count, before[1] + total)
    bind.execute(sa.delete(tallies))
    if folded:
        rows = [{"what": w, "count": c, "total": t} for w, (c, t) in folded.items()]
        bind.execute(sa.insert(tallies), rows)
    with op.batch_alter_table("pruned_tallies", schema=None) as batch_op:
        batch_op.alter_column(
            "what", existing_type=sa.String(length=300), type_=sa.String(length=64)
        )
