"""Engines and sessions. SQLite (embedded) gets WAL, a busy timeout and BEGIN IMMEDIATE so
that concurrent worker threads serialize their writes instead of failing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        _sqlite_pragmas(engine)
        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    engine = create_engine(url, **kwargs)
    _ping_when_idle(engine)
    return engine


# A pooled connection unused for longer than this is pinged before it is handed out.
PING_IDLE_AFTER = 2.0


def _ping_when_idle(engine: Engine) -> None:
    """Pre-ping, but only connections that sat idle: a busy worker checks a connection out
    hundreds of times a second, and a ping each time would cost a round trip per transaction.
    A connection in use when the server went away fails its transaction, which
    :meth:`Database.run` retries on a fresh one."""

    @event.listens_for(engine, "checkin")
    def on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["used_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("used_at", 0.0) < PING_IDLE_AFTER:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # the pool replaces it with a new connection
            raise DisconnectionError(f"stale pooled connection: {exc}") from exc


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let SQLAlchemy's "begin" event emit BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False, autobegin=False)
