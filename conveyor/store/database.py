"""The unit of work: one transaction, retried whole when the database asks for it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from conveyor.exceptions import StoreError
from conveyor.store.db import make_engine, make_sessionmaker
from conveyor.store.hot import Driver, invalidate_pool
from conveyor.store.sql import SqlStore

T = TypeVar("T")
log = logging.getLogger(__name__)

# PostgreSQL: deadlock detected, serialization failure. SQLite: a writer waited too long.
_RETRY_SQLSTATES = {"40P01", "40001"}


class Database:
    """Owns the engine; hands out stores bound to one transaction each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = make_engine(url)
        self._sessions = make_sessionmaker(self.engine)
        autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._autocommits = make_sessionmaker(autocommit)

    @contextmanager
    def transaction(self) -> Iterator[SqlStore]:
        """A store whose work commits when the block exits, or rolls back on an error."""
        with self._sessions() as session, session.begin():
            yield SqlStore(session)

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
        if self.engine.dialect.name != "postgresql":  # SQLite: BEGIN IMMEDIATE regardless
            return self.run(work)
        for attempt in range(1, attempts + 1):
            try:
                with self._driver() as driver, ExitStack() as opened:

                    def session() -> Session:  # for statements off the hot path, if any
                        made = opened.enter_context(self._autocommits())
                        opened.enter_context(made.begin())  # no BEGIN sent: autocommit
                        return made

                    return work(SqlStore(driver=driver, opens=session))
            except DBAPIError as exc:
                if attempt == attempts or not _retryable(exc):
                    raise
                log.warning("statement conflict, retrying (%s): %s", attempt, exc.orig)
        raise StoreError("unreachable")

    @contextmanager
    def _driver(self) -> Iterator[Driver]:
        """A pooled connection in autocommit, for the hot path's statements (store.hot)."""
        pooled = self.engine.raw_connection()  # pinged first if it sat idle

        def lost(exc: BaseException) -> None:
            invalidate_pool(self.engine.pool, pooled, exc)
            pooled.invalidate(exc)

        driver = Driver(pooled.driver_connection, self.engine.dialect, lost)
        try:
            driver.set_autocommit(True)
            yield driver
        finally:
            if pooled.is_valid:
                try:
                    driver.set_autocommit(False)  # as the pool hands connections out
                except DBAPIError:  # broken: the pool must not hand it out again
                    pooled.invalidate()
            pooled.close()

    def dispose(self) -> None:
        self.engine.dispose()


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
