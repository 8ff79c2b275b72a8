"""``conveyor db``: the database schema and the retention sweep."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from conveyor import migrations, wiring
from conveyor.cli import render
from conveyor.cli.common import fail, group
from conveyor.config import archive_retention, get_settings

db_app = group("The database schema.")
WAIT_POLL = 1.0  # seconds between two looks at the schema's revision (conveyor db wait)


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


@db_app.command("wait")
def db_wait(
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Seconds to wait before giving up (exit 1).")
    ] = 300,
) -> None:
    """Wait until the schema is at this release's head revision (`conveyor db upgrade` ran),
    then exit 0; exit 1 after --timeout seconds, saying where it is. A Kubernetes init
    container runs it, so that a pod starts only once the schema is there."""
    head = migrations.head_revision()
    deadline = time.monotonic() + timeout
    while (behind := _short_of(head)) is not None:
        if time.monotonic() >= deadline:
            fail(f"after {timeout:g} s, database {migrations.display_url()} {behind}")
        time.sleep(WAIT_POLL)
    render.out.print(f"database {migrations.display_url()}: at revision {head}", markup=False)


def _short_of(head: str) -> str | None:
    """How the database falls short of ``head`` (unreachable, no schema, an earlier revision)
    and the fix; None when it is there, or at a later release's revision (a schema too)."""
    upgrade = "run `conveyor db upgrade` (on Kubernetes, the conveyor-migrate Job)"
    try:
        current = migrations.current_revision()
    except SQLAlchemyError as exc:
        cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return f"is unreachable ({cause}); check CONVEYOR_DATABASE_URL and that it is up"
    if current is None:
        return f"has no schema (this release's is revision {head}); {upgrade}"
    if current != head and migrations.is_known(current):
        return f"is at revision {current}, not at this release's {head}; {upgrade}"
    return None


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
