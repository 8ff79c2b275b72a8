"""operator keys (an API key that sees every tenant in the dashboard) and each try's traceback

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-26 13:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("operator", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("job_attempts", sa.Column("traceback", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("job_attempts", "traceback")
    op.drop_column("api_keys", "operator")
