"""The unit of work: one transaction, retried whole when the database asks for it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TypeVar

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.pool import PoolProxiedConnection

from conveyor.exceptions import StoreError
from conveyor.store.engines import PING_IDLE_AFTER, make_engine, make_sessionmaker
from conveyor.store.postgres import PostgresStore
from conveyor.store.postgres_statements import Driver, invalidate_pool
from conveyor.store.sql_store import SqlStore
from conveyor.store.sqlite import SqliteStore

T = TypeVar("T")
log = logging.getLogger(__name__)

# PostgreSQL: deadlock detected, serialization failure. SQLite: a writer waited too long.
_RETRY_SQLSTATES = {"40P01", "40001"}


def store_on(session: Session) -> SqlStore:
    """The adapter of the store port for the session's database, over the session (an
    application's own, to trigger inside its transaction): the one place that asks which."""
    if session.get_bind().dialect.name == "postgresql":
        return PostgresStore(session)
    return SqliteStore(session)


def older_snapshot(session: Session) -> str | None:
    """The isolation level of the session's transaction when its reads see a snapshot older
    than each statement (PostgreSQL's REPEATABLE READ or SERIALIZABLE); None when each
    statement sees what committed before it (READ COMMITTED, and SQLite's one writer)."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    level = str(session.execute(text("SHOW transaction_isolation")).scalar_one())
    return None if level == "read committed" else level


class Database:
    """Owns the engine; hands out stores bound to one transaction each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = make_engine(url)
        self._sessions = make_sessionmaker(self.engine)
        autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._autocommits = make_sessionmaker(autocommit)
        self._kept = _KeptConnections()
        self.postgres = self.engine.dialect.name == "postgresql"

    def ping(self) -> None:
        """Ask the database for one row; raises when it does not answer (the readiness
        probe's check)."""
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    @contextmanager
    def transaction(self) -> Iterator[SqlStore]:
        """A store whose work commits when the block exits, or rolls back on an error."""
        with self._sessions() as session, session.begin():
            yield store_on(session)

    @contextmanager
    def snapshot(self) -> Iterator[SqlStore]:
        """A store whose statements all see the database at one moment, for figures read by
        several statements that must add up, as the metrics' are. PostgreSQL: a read-only
        REPEATABLE READ transaction. SQLite: a transaction as any other (BEGIN IMMEDIATE),
        which sees one moment already."""
        with self._sessions() as session, session.begin():
            if self.postgres:
                session.connection(
                    execution_options={
                        "isolation_level": "REPEATABLE READ",
                        "postgresql_readonly": True,
                    }
                )
            yield store_on(session)

    def run(self, work: Callable[[SqlStore], T], *, attempts: int = 5) -> T:
        """Run ``work`` in a transaction, again from the start on a deadlock, a lock timeout
        or a lost connection."""
        for attempt in range(1, attempts + 1):
            try:
                with self.transaction() as store:
                    return work(store)
            except DBAPIError as exc:
                if attempt == attempts or not _retryable(exc):
                    raise
                log.warning("transaction conflict, retrying (%s): %s", attempt, exc.orig)
                time.sleep(0.01 * 2**attempt)
        raise StoreError("unreachable")

    def autocommit(self, work: Callable[[SqlStore], T], *, attempts: int = 3) -> T:
        """Run ``work`` with each statement committing on its own: no BEGIN and COMMIT round
        trips. Only for work whose writes are each one guarded statement, correct whatever
        happens between them (a read, the claim of a job). On SQLite: one transaction."""
        if not self.postgres:  # SQLite: BEGIN IMMEDIATE regardless
            return self.run(work)
        for attempt in range(1, attempts + 1):
            try:
                with self._driver() as driver, ExitStack() as opened:

                    def session() -> Session:  # for statements off the hot path, if any
                        made = opened.enter_context(self._autocommits())
                        opened.enter_context(made.begin())  # no BEGIN sent: autocommit
                        return made

                    return work(PostgresStore(driver=driver, opens=session))
            except DBAPIError as exc:
                if attempt == attempts or not _retryable(exc):
                    raise
                log.warning("statement conflict, retrying (%s): %s", attempt, exc.orig)
        raise StoreError("unreachable")

    @contextmanager
    def _driver(self) -> Iterator[Driver]:
        """A connection in autocommit for the hot path's statements (postgres_statements):
        one this process kept from its last use, or one from the pool."""
        kept = self._kept.take()
        if kept is None:
            pooled = self.engine.raw_connection()  # pinged first if it sat idle
            driver = Driver(pooled.driver_connection, self.engine.dialect, self._lost(pooled))
            kept = _Kept(pooled, driver)
            try:
                driver.set_autocommit(True)
            except DBAPIError:  # back to the pool (invalidated, if the server is gone)
                kept.put_back()
                raise
        try:
            yield kept.driver
        finally:
            if not self._kept.keep(kept):
                kept.put_back()

    def _lost(self, pooled: PoolProxiedConnection) -> Callable[[BaseException], None]:
        def lost(exc: BaseException) -> None:
            invalidate_pool(self.engine.pool, pooled, exc)
            pooled.invalidate(exc)

        return lost

    def put_back_kept(self) -> None:
        """Hand the connections kept for the hot path back to the pool."""
        self._kept.put_back_all()

    def dispose(self) -> None:
        self.put_back_kept()
        self.engine.dispose()


class _Kept:
    """A pooled connection checked out in autocommit, and when it was last used."""

    def __init__(self, pooled: PoolProxiedConnection, driver: Driver) -> None:
        self.pooled, self.driver = pooled, driver
        self.used_at = time.monotonic()

    def put_back(self) -> None:
        """To the pool, out of autocommit as the pool hands connections out."""
        if self.pooled.is_valid:
            try:
                self.driver.set_autocommit(False)
            except DBAPIError:  # broken: the pool must not hand it out again
                self.pooled.invalidate()
        self.pooled.close()


class _KeptConnections:
    """The hot path's connections, kept checked out between uses (at most ``most``): a
    checkout from SQLAlchemy's pool and the switches in and out of autocommit cost more client
    CPU than the statement they were for. One kept longer than ``PING_IDLE_AFTER`` unused is
    pinged first, as the pool pings its own. A forked child never uses its parent's: they
    share the parent's sockets (and stay referenced, so that nothing closes them here)."""

    def __init__(self, most: int = 2) -> None:
        self.most = most
        self._by_process: dict[int, list[_Kept]] = {}

    def _mine(self) -> list[_Kept]:
        return self._by_process.setdefault(os.getpid(), [])

    def take(self) -> _Kept | None:
        mine = self._mine()
        while True:
            try:
                kept = mine.pop()  # atomic: threads may take at once
            except IndexError:
                return None
            if time.monotonic() - kept.used_at < PING_IDLE_AFTER or _alive(kept):
                return kept
            kept.put_back()  # the pool replaces it

    def keep(self, kept: _Kept) -> bool:
        mine = self._mine()
        if not kept.pooled.is_valid or len(mine) >= self.most:
            return False
        kept.used_at = time.monotonic()
        mine.append(kept)
        return True

    def put_back_all(self) -> None:
        mine = self._mine()
        while True:
            try:
                kept = mine.pop()
            except IndexError:
                return
            kept.put_back()


def _alive(kept: _Kept) -> bool:
    try:
        kept.driver.ping()
    except DBAPIError:
        return False
    return True


def _retryable(exc: DBAPIError) -> bool:
    if exc.connection_invalidated:
        # The server went away. Run the work again: if its commit did land before, its
        # guarded steps find their work done (a message it should have sent is re-published
        # by the recovery sweep).
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate in _RETRY_SQLSTATES:
        return True
    return isinstance(exc, OperationalError) and "database is locked" in str(exc.orig)
