"""Alembic environment: the same migrations run on PostgreSQL and SQLite (batch mode)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from conveyor.config import get_settings
from conveyor.models import Base
from conveyor.store.engines import make_engine

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url
    engine = make_engine(url)
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            _run_sqlite(conn)
        else:
            _run(conn)
    engine.dispose()


def _run_sqlite(conn: Connection) -> None:
    """SQLite alters a table by copying it and dropping the original: with foreign keys on,
    that DROP would cascade to every row referring to it (jobs, node states, attempts). So
    they are off while migrating (a pragma only takes effect outside a transaction) and
    checked after."""
    raw = conn.connection.dbapi_connection
    assert raw is not None
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        _run(conn)
        broken = raw.execute("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"the migration left rows breaking foreign keys: {broken[:5]}")
    finally:
        raw.execute("PRAGMA foreign_keys=ON")


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `conveyor db upgrade`")
run_migrations_online()
