"""The migrations build the schema the models describe, on PostgreSQL and on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text
from typer.testing import CliRunner

from conveyor import migrations
from conveyor.cli import app
from conveyor.config import get_settings
from conveyor.models import Base
from conveyor.store.engines import make_engine
from tests.conftest import PG_ADMIN_URL, RUN_ID
from tests.support.logging_state import kept_logging
from tests.support.services import alembic_config, create_database, drop_database

CONVEYOR = str(Path(sys.executable).parent / "conveyor")  # the installed console script


@pytest.fixture
def postgres_url() -> Iterator[str]:
    name = f"conveyor_migrations_{RUN_ID}"
    create_database(PG_ADMIN_URL, name)
    yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    drop_database(PG_ADMIN_URL, name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'conveyor.db'}"


@pytest.fixture(params=["postgres", "sqlite"])
def empty_database(request: pytest.FixtureRequest) -> str:
    fixture = "postgres_url" if request.param == "postgres" else "sqlite_url"
    return str(request.getfixturevalue(fixture))


def schema_drift(url: str) -> list[object]:
    engine = make_engine(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    return list(diff)


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    names = set(inspect(engine).get_table_names())
    engine.dispose()
    return names - {"alembic_version"}


def test_upgrade_from_empty_matches_the_models(empty_database: str) -> None:
    command.upgrade(alembic_config(empty_database), "head")

    assert table_names(empty_database) == set(Base.metadata.tables)
    assert schema_drift(empty_database) == []


def stream_triggers(url: str) -> set[str]:
    engine = make_engine(url)
    query = (
        "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
        if engine.dialect.name == "postgresql"
        else "SELECT name FROM sqlite_master WHERE type = 'trigger'"
    )
    with engine.connect() as conn:
        names = {row[0] for row in conn.exec_driver_sql(query)}
    engine.dispose()
    return names


def test_the_stream_triggers_of_executions_outlive_every_later_migration(
    empty_database: str,
) -> None:
    # A later migration that makes SQLite copy `executions` (batch mode) would drop them, and
    # the tenant streams would hear nothing more.
    command.upgrade(alembic_config(empty_database), "head")

    expected = (
        {"conveyor_stream_event"}
        if empty_database.startswith("postgresql")
        else {"conveyor_stream_event_insert", "conveyor_stream_event_update"}
    )
    assert expected <= stream_triggers(empty_database)


def test_downgrade_round_trip_leaves_nothing_then_rebuilds(empty_database: str) -> None:
    config = alembic_config(empty_database)
    command.upgrade(config, "head")

    command.downgrade(config, "base")
    assert table_names(empty_database) == set()

    command.upgrade(config, "head")
    assert schema_drift(empty_database) == []


ROWS_AT_0002 = [
    "INSERT INTO tenants (id, name, created_at) VALUES ('t1', 'x', '2026-01-01')",
    "INSERT INTO workflows (id, tenant_id, name, version, digest, definition, created_at) "
    "VALUES ('w1', 't1', 'w', 1, 'd', '{}', '2026-01-01')",
    "INSERT INTO executions (id, tenant_id, workflow_id, status, priority, trigger, input, "
    "remaining_nodes, created_at) VALUES ('e1', 't1', 'w1', 'running', 'high', 'api', '{}', 1, "
    "'2026-01-01')",
    "INSERT INTO jobs (id, kind, queue, data, status, priority, max_retries, retry_count, "
    "tenant_id, workflow_id, execution_id, created_at, enqueued_at) VALUES ('j1', 'node', 'q', "
    "'{}', 'processing', 'high', 0, 0, 't1', 'w1', 'e1', '2026-01-01', '2026-01-01')",
    "INSERT INTO node_states (execution_id, node_id, status, waiting_on) "
    "VALUES ('e1', 'a', 'running', 0)",
]


def test_upgrading_an_embedded_database_keeps_its_work(sqlite_url: str) -> None:
    # Given an embedded (SQLite) database at 0002 with an execution, a job and a node running
    config = alembic_config(sqlite_url)
    command.upgrade(config, "0002")
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        for statement in ROWS_AT_0002:
            conn.exec_driver_sql(statement)
    engine.dispose()

    # When it is upgraded (SQLite rebuilds altered tables: copy, drop, rename)
    command.upgrade(config, "head")

    # Then nothing cascaded away with a dropped table
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        counts = [conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar()
                  for t in ("executions", "jobs", "node_states")]  # fmt: skip
    engine.dispose()
    assert counts == [1, 1, 1]


def test_db_upgrade_says_what_it_did_to_a_fresh_then_current_then_older_database(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_DATABASE_URL", postgres_url)
    get_settings.cache_clear()
    head = ScriptDirectory.from_config(alembic_config(postgres_url)).get_current_head()

    with kept_logging():  # the command configures this process's logging
        created = CliRunner().invoke(app, ["db", "upgrade"])
        again = CliRunner().invoke(app, ["db", "upgrade"])
        command.downgrade(alembic_config(postgres_url), "0009")
        caught_up = CliRunner().invoke(app, ["db", "upgrade"])
    get_settings.cache_clear()

    assert created.exit_code == 0, created.output
    assert f"created the schema at revision {head}" in created.stdout
    assert f"up to date at revision {head}, nothing to do" in again.stdout
    assert f"upgraded from revision 0009 to {head}" in caught_up.stdout
    assert postgres_url.rsplit("/", 1)[1] in created.stdout  # which database


def test_downgrading_past_0013_folds_the_labelled_tallies_into_unlabelled_ones(
    empty_database: str,
) -> None:
    # Given tallies at 0013, labelled by queue (and workflow) and from before the labels
    config = alembic_config(empty_database)
    command.upgrade(config, "0013")
    rows = [("attempts:failed", 3, 0.0), ("waited", 2, 0.5), ("waited|workflow-node", 4, 1.5),
            ("waited|workflow-execution", 1, 0.25), ("waited<=0.5|workflow-node", 4, 0.0),
            ("waited<=0.5", 2, 0.0), ("duration|workflow-node|orders", 5, 10.0),
            ("duration|workflow-node|billing", 6, 2.0)]  # fmt: skip
    engine = make_engine(empty_database)
    with engine.begin() as conn:
        for what, count, total in rows:
            conn.exec_driver_sql(
                "INSERT INTO pruned_tallies (what, count, total) VALUES "
                f"('{what}', {count}, {total})"
            )
    engine.dispose()

    # When the schema goes back to 0012, whose rows have no labels
    command.downgrade(config, "0012")

    # Then each figure is the sum of its labelled rows
    engine = make_engine(empty_database)
    with engine.connect() as conn:
        kept = {what: (count, total) for what, count, total in conn.exec_driver_sql(
            "SELECT what, count, total FROM pruned_tallies")}  # fmt: skip
    engine.dispose()
    assert kept == {
        "attempts:failed": (3, 0.0),
        "waited": (7, 2.25),
        "waited<=0.5": (6, 0.0),
        "duration": (11, 12.0),
    }


def test_upgrading_to_0015_copies_each_try_s_queue_and_workflow_from_its_job(
    empty_database: str,
) -> None:
    # Given a try at 0014, whose row names only its job
    config = alembic_config(empty_database)
    command.upgrade(config, "0014")
    engine = make_engine(empty_database)
    ids = {key: f"00000000-0000-0000-0000-00000000000{n}" for n, key in enumerate("twej", 1)}
    if not empty_database.startswith("postgresql"):  # SQLite stores a Uuid as 32 hex digits
        ids = {k: v.replace("-", "") for k, v in ids.items()}
    rows = [statement.replace("'t1'", f"'{ids['t']}'").replace("'w1'", f"'{ids['w']}'")
            .replace("'e1'", f"'{ids['e']}'").replace("'j1'", f"'{ids['j']}'")
            for statement in ROWS_AT_0002]  # fmt: skip
    with engine.begin() as conn:
        for statement in rows:
            conn.exec_driver_sql(statement)
        conn.exec_driver_sql(
            "INSERT INTO job_attempts (job_id, attempt_number, status, started_at, timed_out) "
            f"VALUES ('{ids['j']}', 1, 'running', '2026-01-01', false)"
        )
    engine.dispose()

    # When it is upgraded
    command.upgrade(config, "0015")

    # Then the try names its job's queue and workflow version (what the metrics group by)
    engine = make_engine(empty_database)
    with engine.connect() as conn:
        found = conn.exec_driver_sql("SELECT queue, workflow_id FROM job_attempts").one()
    engine.dispose()
    assert (found[0], str(found[1]).replace("-", "")) == ("q", ids["w"].replace("-", ""))


def test_the_child_columns_come_and_go_without_rebuilding_the_sqlite_table(sqlite_url: str) -> None:
    # A rebuilt executions table (an Alembic batch that copies it) loses the triggers that
    # write the tenant streams' events (0017): 0022 must add and drop its columns in place.
    config = alembic_config(sqlite_url)
    engine = make_engine(sqlite_url)

    def triggers() -> list[str]:
        with engine.connect() as conn:
            found = conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name"
            )
            return [row[0] for row in found]

    expected = ["conveyor_stream_event_insert", "conveyor_stream_event_update"]
    command.upgrade(config, "0022")
    assert triggers() == expected
    assert "depth" in {c["name"] for c in inspect(engine).get_columns("executions")}
    command.downgrade(config, "0021")
    assert triggers() == expected
    assert "depth" not in {c["name"] for c in inspect(engine).get_columns("executions")}
    engine.dispose()


def waiting(engine: Engine, pid: int | None = None) -> bool:
    """Whether a session of the database (``pid``'s, if given) waits for a lock."""
    only = "" if pid is None else f" AND l.pid = {int(pid)}"
    with engine.connect() as conn:
        return bool(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                f"WHERE NOT l.granted AND a.datname = current_database(){only}"
            ).scalar()
        )


def until(done: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("before", "after", "write"),
    [
        ("0020", "0021", "UPDATE jobs SET priority = 'low'"),
        ("0022", "0023", "UPDATE executions SET priority = 'low'"),
    ],
)
def test_an_index_build_on_a_large_table_waits_for_older_transactions_not_writes(
    postgres_url: str, before: str, after: str, write: str
) -> None:
    # Given a database at `before` with an execution and its job, and a transaction holding
    # a snapshot older than the upgrade (a long report, say)
    config = alembic_config(postgres_url)
    command.upgrade(config, before)
    engine = make_engine(postgres_url)
    ids = {key: f"00000000-0000-0000-0000-00000000000{n}" for n, key in enumerate("twej", 1)}
    with engine.begin() as conn:
        for statement in ROWS_AT_0002:
            for key, value in ids.items():
                statement = statement.replace(f"'{key}1'", f"'{value}'")
            conn.exec_driver_sql(statement)
    reader = engine.connect().execution_options(isolation_level="REPEATABLE READ")
    reader.begin()
    reader.exec_driver_sql("SELECT count(*) FROM tenants").scalar()

    # When the upgrade runs, and the indexed table is written while the upgrade waits
    upgrading = threading.Thread(target=command.upgrade, args=(config, after))
    upgrading.start()
    until(lambda: not upgrading.is_alive() or waiting(engine), "the upgrade to wait or end")
    waited = upgrading.is_alive()
    writer: list[int] = []

    def write_once() -> None:
        with engine.begin() as conn:
            writer.append(int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() or 0))
            conn.exec_driver_sql(write)

    writing = threading.Thread(target=write_once)
    writing.start()
    until(lambda: not writing.is_alive() or (bool(writer) and waiting(engine, writer[0])),
          "the write to end or wait")  # fmt: skip
    wrote = not writing.is_alive()
    reader.rollback()
    reader.close()
    upgrading.join(timeout=120)
    writing.join(timeout=120)
    engine.dispose()

    # Then the build waited for the older snapshot (it is concurrent) and let the write by
    assert waited, "the index was built at once: not concurrently"
    assert wrote, "the write waited for the index build"
    assert migrations.current_revision(postgres_url) == after


def test_0021_stopped_during_its_index_builds_runs_again_to_the_end(postgres_url: str) -> None:
    # Given a database that 0021 left midway: its columns committed, one index built and one
    # left behind invalid (a build stopped), the old key still there
    config = alembic_config(postgres_url)
    command.upgrade(config, "0020")
    engine = make_engine(postgres_url)
    with engine.begin() as conn:
        for table, columns in (("jobs", ("item_index integer", "item jsonb", "output jsonb")),
                               ("node_states", ("items_total integer", "items_left integer",
                                                "items_failed integer"))):  # fmt: skip
            for column in columns:
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column}")
        conn.exec_driver_sql(
            "CREATE UNIQUE INDEX uq_jobs_execution_node_item ON jobs "
            "(execution_id, node_id, item_index) WHERE item_index IS NOT NULL"
        )
        conn.exec_driver_sql(
            "CREATE UNIQUE INDEX uq_jobs_execution_node_0021 ON jobs (execution_id, node_id)"
        )
        conn.exec_driver_sql(
            "UPDATE pg_index SET indisvalid = false "
            "WHERE indexrelid = 'uq_jobs_execution_node_0021'::regclass"
        )
    engine.dispose()

    # When the upgrade runs again
    command.upgrade(config, "head")

    # Then it ends with the schema the models describe
    assert schema_drift(postgres_url) == []
    engine = make_engine(postgres_url)
    with engine.connect() as conn:
        invalid = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_index WHERE NOT indisvalid"
        ).scalar()
        key = conn.exec_driver_sql(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'uq_jobs_execution_node'"
        ).scalar()
    engine.dispose()
    assert invalid == 0
    assert "WHERE ((node_id IS NOT NULL) AND (item_index IS NULL))" in str(key)


def test_db_wait_exits_once_the_schema_is_at_head_and_says_why_on_timeout(
    postgres_url: str,
) -> None:
    env = {**os.environ, "CONVEYOR_DATABASE_URL": postgres_url}
    head = ScriptDirectory.from_config(alembic_config(postgres_url)).get_current_head()
    gone = postgres_url.rsplit("/", 1)[0] + "/conveyor_never_made"

    # An empty database, or none at all: it gives up after its timeout, saying what is wrong
    empty = conveyor("db", "wait", "--timeout", "0", env=env)
    assert empty.returncode == 1
    assert f"has no schema (this release's is revision {head}); run `conveyor db upgrade`" in (
        " ".join(empty.stderr.split())
    )
    missing = conveyor("db", "wait", "--timeout", "0", env={**env, "CONVEYOR_DATABASE_URL": gone})
    assert missing.returncode == 1
    assert "is unreachable" in missing.stderr and "conveyor_never_made" in missing.stderr

    # Waiting on the empty database, it exits 0 once the schema has been brought to head
    with subprocess.Popen(
        [CONVEYOR, "db", "wait", "--timeout", "120"], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    ) as waiting:  # fmt: skip
        command.upgrade(alembic_config(postgres_url), "0021")
        assert waiting.poll() is None  # a revision short of head is not enough
        command.upgrade(alembic_config(postgres_url), "head")
        out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert f"at revision {head}" in out

    # And a database a later release migrated further is there too
    engine = make_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    assert conveyor("db", "wait", "--timeout", "0", env=env).returncode == 0


def conveyor(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CONVEYOR, *args], env=env, text=True, capture_output=True, timeout=60)
