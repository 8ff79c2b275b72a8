"""Contract tier: the store cases of tests/unit/transitions, the same functions, on every adapter
of the port: in memory, SQLite (a file migrated as the embedded default migrates its own) and
PostgreSQL (a database of this run's own, driven through :class:`Database`'s autocommit and
transaction units as the service drives it). A missing PostgreSQL fails the run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import migrations
from conveyor.models import Base
from conveyor.store import Database
from conveyor.testing import Clock
from tests.conftest import PG_ADMIN_URL, RUN_ID
from tests.support import services
from tests.support.bench import Bench, fresh_engine_memory, memory_bench
from tests.support.sql_probe import SqlProbe

CONTRACT_DB = f"conveyor_contract_{RUN_ID}"
CONTRACT_DB_URL = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + CONTRACT_DB


@pytest.fixture(autouse=True)
def _fresh_engine_memory() -> Iterator[None]:
    with fresh_engine_memory():
        yield


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[Database]:
    services.create_database(PG_ADMIN_URL, CONTRACT_DB)
    services.prepare_schema(CONTRACT_DB_URL)
    database = Database(CONTRACT_DB_URL)
    yield database
    database.dispose()
    services.drop_database(PG_ADMIN_URL, CONTRACT_DB)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database file migrated once; each test runs on a copy of it."""
    path = tmp_path_factory.mktemp("sqlite") / "template.db"
    migrations.upgrade(f"sqlite:///{path}")
    return path


def emptied(database: Database) -> None:
    """Every row deleted (a few rows a table: quicker than services.truncate's TRUNCATE)."""
    with database.engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):
            connection.execute(table.delete())


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def bench(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Bench]:
    if request.param == "memory":
        yield memory_bench()
    elif request.param == "sqlite":
        path = tmp_path / "conveyor.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        database = Database(f"sqlite:///{path}")
        yield Bench(kind="sqlite", units=database, probe=SqlProbe(database), clock=Clock())
        database.dispose()
    else:
        database = request.getfixturevalue("postgres_database")
        emptied(database)
        yield Bench(kind="postgres", units=database, probe=SqlProbe(database), clock=Clock())
