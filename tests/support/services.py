"""Real-service fixtures' helpers: the run's own PostgreSQL database and Redis db."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from conveyor.engine.states import ExecutionStatus
from conveyor.models import Base, Execution
from conveyor.service import Conveyor

ROOT = Path(__file__).resolve().parents[2]

EFFECTS_DDL = """
CREATE TABLE test_effects (
    id SERIAL PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    node_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    value TEXT,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)
"""
SPANS_DDL = """
CREATE TABLE test_spans (
    id SERIAL PRIMARY KEY,
    execution_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    workflow TEXT NOT NULL,
    started DOUBLE PRECISION NOT NULL,
    ended DOUBLE PRECISION NOT NULL,
    pid INTEGER NOT NULL
)
"""
# Every table of the models (a new one is emptied between tests without a word here), and
# the tests' own.
TABLES = ", ".join([*(t.name for t in Base.metadata.sorted_tables), "test_effects", "test_spans"])


def alembic_config(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def create_database(admin_url: str, name: str) -> None:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()


def drop_database(admin_url: str, name: str) -> None:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def prepare_schema(url: str) -> None:
    command.upgrade(alembic_config(url), "head")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(EFFECTS_DDL))
        conn.execute(text(SPANS_DDL))
    engine.dispose()


def truncate(url: str, attempts: int = 5) -> None:
    """Empty every table. A worker thread may still be finishing the last test's work: the
    TRUNCATE's table locks can then deadlock with its transaction, and PostgreSQL picks the
    TRUNCATE to fail; it is tried again."""
    engine = create_engine(url)
    try:
        for attempt in range(1, attempts + 1):
            try:
                with engine.begin() as conn:
                    conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
                return
            except OperationalError as exc:
                if attempt == attempts or getattr(exc.orig, "sqlstate", None) != "40P01":
                    raise
                time.sleep(0.1 * attempt)
    finally:
        engine.dispose()


def clear_limits(url: str, prefix: str = "conveyor:limits") -> None:
    """Forget every permit and parked job (the limiter's keys only; the broker's stay)."""
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()


def flush_redis(url: str) -> None:
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


def wait_for(service: Conveyor, execution_id: uuid.UUID, timeout: float = 30.0) -> Execution:
    """Poll until the execution finishes; fail the test with its state if it does not."""
    deadline = time.monotonic() + timeout
    while True:
        with service.db.transaction() as store:
            row = store.execution_row(execution_id)
            nodes = {n.node_id: n.status.value for n in store.execution_nodes(execution_id)}
            jobs = {
                f"{j.node_id or 'start'} job {j.id}": j.status.value
                for j, _ in store.execution_jobs(execution_id)
            }
        if row.status in (
            ExecutionStatus.COMPLETED,
            ExecutionStatus.FAILED,
            ExecutionStatus.CANCELLED,
        ):
            return row
        if time.monotonic() > deadline:
            raise AssertionError(
                f"execution {execution_id} still {row.status.value} after {timeout} s: "
                f"nodes {nodes}, jobs {jobs}"
            )
        time.sleep(0.05)


def effects(url: str) -> list[dict[str, Any]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM test_effects ORDER BY id")).mappings().all()
    engine.dispose()
    return [dict(r) for r in rows]


@dataclass(frozen=True)
class Span:
    """One node run as the node itself saw it: inside the permits it held."""

    execution_id: str
    node_id: str
    tenant: str
    workflow: str
    started: float
    ended: float


def spans(url: str) -> list[Span]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT execution_id, node_id, tenant, workflow, started, ended "
                "FROM test_spans ORDER BY started"
            )
        ).all()
    engine.dispose()
    return [Span(*r) for r in rows]


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an interval ending as another starts does not
    overlap it)."""
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda e: (e[0], e[1]),
    )
    open_now = peak = 0
    for _, delta in events:
        open_now += delta
        peak = max(peak, open_now)
    return peak


@contextmanager
def statements(service: Conveyor) -> Iterator[list[str]]:
    """The SQL statements this thread sends to the database inside the block, through the
    engine or on the driver's connection (store.postgres_statements); the worker's threads share the
    process: theirs are not counted."""
    assert service.db.engine.dialect.name == "postgresql"
    sent: list[str] = []
    me = threading.get_ident()
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def counted(real: Any) -> Any:
        def run(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == me:
                sent.append(str(query))
            return real(cursor, query, *args, **kwargs)

        return run

    psycopg.Cursor.execute = counted(execute)  # type: ignore[method-assign]
    psycopg.Cursor.executemany = counted(executemany)  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]


def lock_waiters(service: Conveyor) -> int:
    """How many of the service database's sessions wait for a lock (a race a test holds)."""
    with service.db.transaction() as store:
        return int(
            store.session.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "it did not happen in time"
        time.sleep(0.02)


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``work`` started on a thread of its own; what it returned (or raised), once done."""
    ended: list[Any] = []

    def run_it() -> None:
        try:
            ended.append(work())
        except Exception as exc:
            ended.append(exc)

    thread = threading.Thread(target=run_it, daemon=True)
    thread.start()
    return thread, ended
