"""What every part of :class:`~conveyor.store.sql_store.SqlStore` stands on: the session, Core
statements on its connection, and the tables they address."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, Executable, Table, literal_column
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from conveyor.exceptions import StoreError
from conveyor.models import Execution, Job, JobAttempt, NodeState, Tenant, WorkflowVersion

# The tables, for the Core statements of the hot path (see StoreCore._core).
JOBS = cast(Table, Job.__table__)
EXECUTIONS = cast(Table, Execution.__table__)
NODE_STATES = cast(Table, NodeState.__table__)
ATTEMPTS = cast(Table, JobAttempt.__table__)
WORKFLOWS = cast(Table, WorkflowVersion.__table__)
TENANTS = cast(Table, Tenant.__table__)


def upsert(session: Session, model: type[Any]) -> postgresql.Insert | sqlite.Insert:
    """An INSERT of ``model`` in the session's dialect, whose ``on_conflict_do_*`` both
    PostgreSQL and SQLite (the embedded default) understand."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model)
    return sqlite.insert(model)


def unindexed(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """A column as an expression no index holds (``column || ''``), for the condition of a
    statement that finds its rows by key: a job's status in a transition, above all. Compared
    as the column, a plan may take the jobs by a status index instead (the plain one, or a
    partial one whose condition the comparison implies) and filter them by key. PostgreSQL
    prefers that whenever its statistics say few jobs have the status, and keeps a prepared
    statement's plan: a claim planned while nothing was queued read the whole backlog for
    every job of a later one (see the note above store.postgres_statements's claim)."""
    return column.op("||", return_type=column.type)(literal_column("''"))


class StoreCore(ABC):
    """One SQLAlchemy session, opened on first use when the store was made without one (an
    autocommit unit, whose hot statements run on a connection of their own)."""

    def __init__(
        self, session: Session | None = None, *, opens: Callable[[], Session] | None = None
    ) -> None:
        self._session = session
        self._opens = opens

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
        session synchronisation) buys nothing. The hottest go further (the PostgreSQL
        adapter's driver statements)."""
        return self.session.connection().execute(statement, params)

    @abstractmethod
    def _nodes_among(self, node_ids: Iterable[str]) -> ColumnElement[bool]:
        """``node_id`` is one of ``node_ids``, as the database plans it best."""
