"""What every part of :class:`~conveyor.store.sql.SqlStore` stands on: the session, Core
statements on its connection, the hot path's driver, and the tables they address."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import CursorResult, Executable, Table
from sqlalchemy.orm import Session

from conveyor.exceptions import StoreError
from conveyor.models import Execution, Job, JobAttempt, NodeState, Tenant, WorkflowVersion
from conveyor.store import hot

log = logging.getLogger(__name__)

# How long a worker waits for the commit of a trigger that announced a job before committing
# (StoreCore._await_announced): a trigger holds it for as long as publishing takes.
ANNOUNCE_WAIT = 10.0

# The tables, for the Core statements of the hot path (see StoreCore._core).
JOBS = cast(Table, Job.__table__)
EXECUTIONS = cast(Table, Execution.__table__)
NODE_STATES = cast(Table, NodeState.__table__)
ATTEMPTS = cast(Table, JobAttempt.__table__)
WORKFLOWS = cast(Table, WorkflowVersion.__table__)
TENANTS = cast(Table, Tenant.__table__)


class StoreCore:
    """One SQLAlchemy session (PostgreSQL or SQLite); on PostgreSQL the hot path's
    statements (store.hot) run on the session's driver connection, or on the autocommit
    unit's own."""

    def __init__(
        self,
        session: Session | None = None,
        driver: hot.Driver | None = None,
        *,
        opens: Callable[[], Session] | None = None,
    ) -> None:
        """Over ``session``; or, in an autocommit unit, over ``driver`` (the connection of
        the hot statements) and a session that ``opens`` makes when another statement runs."""
        self._session = session
        self._opens = opens
        self._driver = driver
        self._alone = driver is not None  # an autocommit unit: no transaction around it

    @property
    def session(self) -> Session:
        if self._session is None:
            if self._opens is None:
                raise StoreError("this store has no session")
            self._session = self._opens()
        return self._session

    @session.setter  # (the query mixins declare ``session`` a plain attribute)
    def session(self, session: Session) -> None:
        self._session = session

    def _core(self, statement: Executable, params: Any = None) -> CursorResult[Any]:
        """Run a Core statement on the transaction's connection: statements that read
        records, never ORM objects, so the ORM's bookkeeping per statement (identity map,
        session synchronisation) buys nothing. The hottest go further (:meth:`_hot`)."""
        return self.session.connection().execute(statement, params)

    @property
    def _postgres(self) -> bool:
        return self._driver is not None or self.session.get_bind().dialect.name == "postgresql"

    def _announcing(self) -> hot.Driver | None:
        """The driver that can announce jobs before its commit: an autocommit unit's."""
        return self._driver if self._alone else None

    def _await_announced(self, job_id: uuid.UUID) -> bool:
        """Called when a job a message named is not there: if a trigger announced it before
        its commit (:meth:`hot.Driver.rows_announced`), wait for that commit. True when the
        caller should look again; False where nothing can have been announced (SQLite, a
        transaction's store), or when the trigger still held its lock after
        ``ANNOUNCE_WAIT`` seconds: the message is dropped, and should that trigger commit,
        the recovery sweep publishes its job again (as it does a message lost)."""
        if not self._alone or self._driver is None:
            return False
        if self._driver.await_announced(job_id, ANNOUNCE_WAIT):
            return True
        log.warning(
            "job %s: its trigger had not committed after %.0f s; the message is dropped and "
            "the recovery sweep publishes the job again if it commits",
            job_id,
            ANNOUNCE_WAIT,
        )
        return False

    def _hot(self, statement: hot.Statement, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run a statement of the hot path on the driver's connection (PostgreSQL only): the
        autocommit unit's, or the transaction's."""
        if self._driver is None:
            self._driver = hot.Driver.of(self.session.connection())
        return self._driver.rows(statement, params)
