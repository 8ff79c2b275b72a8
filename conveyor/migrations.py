"""Schema migrations, run programmatically: ``conveyor db upgrade`` and the embedded default.

The Alembic environment (``alembic.ini`` and ``migrations/``) lives at the repository root, beside
the ``conveyor`` package; its location is set explicitly so that it works from any directory.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command, op
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError as AlembicError
from sqlalchemy import text
from sqlalchemy.engine import make_url

import conveyor
from conveyor.config import get_settings
from conveyor.exceptions import ConfigurationError
from conveyor.store.engines import make_engine

ROOT = Path(conveyor.__file__).resolve().parent.parent
MIGRATIONS = ROOT / "migrations"


def alembic_config(url: str | None = None) -> Config:
    """The Alembic configuration for ``url`` (default: the configured database)."""
    ini = ROOT / "alembic.ini"
    if not ini.is_file() or not (MIGRATIONS / "env.py").is_file():
        raise ConfigurationError(
            f"the migrations are not at {ROOT}; install Conveyor from a source checkout "
            f"(pip install -e .) so that alembic.ini and migrations/ sit beside the package"
        )
    config = Config(str(ini))
    config.set_main_option("script_location", str(MIGRATIONS))
    # configparser treats % as interpolation; URL-encoded passwords contain it
    config.set_main_option("sqlalchemy.url", _url(url).replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the schema of ``url`` (default: the configured database) up to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def current_revision(url: str | None = None) -> str | None:
    """The schema revision of ``url`` (default: the configured database); None while it has
    none (an empty database)."""
    engine = make_engine(_url(url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def build_index(
    name: str, table: str, columns: list[str], *, unique: bool = False, where: str | None = None
) -> None:
    """In a migration: an index built without blocking the table's writes. PostgreSQL:
    ``CREATE INDEX CONCURRENTLY``, which runs outside a transaction, so it commits the
    migration's work before it (Alembic's autocommit block), and first drops an index of
    that name a build stopped midway left behind (invalid): a migration stopped there runs
    again whole. SQLite: a plain CREATE INDEX in the migration's transaction (one writer)."""
    predicate = text(where) if where is not None else None
    if op.get_context().dialect.name != "postgresql":
        op.create_index(name, table, columns, unique=unique, sqlite_where=predicate)
        return
    with op.get_context().autocommit_block():
        op.drop_index(name, table_name=table, postgresql_concurrently=True, if_exists=True)
        op.create_index(
            name, table, columns, unique=unique, postgresql_where=predicate,
            postgresql_concurrently=True,
        )  # fmt: skip


def head_revision() -> str:
    """The revision this release's migrations end at (one head: ``alembic heads``)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise ConfigurationError(f"the migrations at {MIGRATIONS} have no revision")
    return head


def is_known(revision: str) -> bool:
    """Whether ``revision`` is one of this release's migrations; a database at another one
    was migrated by a later release."""
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except AlembicError:
        return False


def display_url(url: str | None = None) -> str:
    """The database URL with its password hidden, for messages."""
    return make_url(_url(url)).render_as_string(hide_password=True)


def _url(url: str | None) -> str:
    return url or get_settings().resolved_database_url
