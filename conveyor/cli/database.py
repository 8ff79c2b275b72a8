"""``conveyor db``: the database schema and the retention sweep."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from conveyor import migrations, wiring
from conveyor.cli import render
from conveyor.cli.common import group
from conveyor.config import archive_retention, get_settings

db_app = group("The database schema.")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration (alembic upgrade head) to CONVEYOR_DATABASE_URL."""
    before = migrations.current_revision()
    migrations.upgrade()
    after = migrations.current_revision()
    render.out.print(
        f"database {migrations.display_url()}: {_upgraded(before, after)}", markup=False
    )


def _upgraded(before: str | None, after: str | None) -> str:
    if before is None:
        return f"created the schema at revision {after}"
    if before == after:
        return f"up to date at revision {after}, nothing to do"
    return f"upgraded from revision {before} to {after}"


@db_app.command("prune")
def db_prune(
    older_than: Annotated[
        float | None,
        typer.Option("--older-than", help="Days; default CONVEYOR_RETENTION_DAYS.", min=0),
    ] = None,
    archive_older_than: Annotated[
        float | None,
        typer.Option(
            "--archive-older-than",
            help="Days since a dead letter was discarded to the archive; default "
            "CONVEYOR_ARCHIVE_RETENTION_DAYS; 0 keeps the archive.",
            min=0,
        ),
    ] = None,
) -> None:
    """Delete finished executions (with their jobs, tries and node states) older than the
    retention; beat runs the same sweep every CONVEYOR_RETENTION_INTERVAL seconds."""
    settings = get_settings()
    days = settings.retention_days if older_than is None else older_than
    archive = settings.archive_retention_days if archive_older_than is None else archive_older_than
    pruned = wiring.service().prune(
        timedelta(days=days), most=10**12, archive_older_than=archive_retention(archive)
    )
    render.out.print(f"{pruned} finished execution(s) older than {days:g} day(s) deleted")
