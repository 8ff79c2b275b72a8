"""Units of work for tests: the in-memory database, whose failed work leaves no trace, and what
a test needs beside it (a clock it moves, a workflow applied for a tenant). The helpers take
any :class:`UnitOfWork`: :class:`InMemoryDatabase` or :class:`conveyor.store.Database`."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

from conveyor.engine import subscriptions, workflows
from conveyor.engine.definitions import Workflow
from conveyor.engine.ports import Store
from conveyor.engine.records import WorkflowRecord
from conveyor.engine.states import DEFAULT_TENANT
from conveyor.engine.validation import parse_workflow
from conveyor.scheduler import schedules
from conveyor.testing.memory_store import InMemoryStore
from conveyor.testing.tables import Tables

T = TypeVar("T")


class StoreWithTenants(Store, Protocol):
    """The store port and the making of tenants, which every adapter offers and only
    operators' commands use (a test makes the tenants it triggers for)."""

    def create_tenant(self, name: str) -> uuid.UUID:
        """The tenant's id, the tenant made if it is new."""
        ...


class UnitOfWork(Protocol):
    """What hands out stores, one unit of work each, as the service drives the engine:
    :class:`InMemoryDatabase`, or :class:`conveyor.store.Database` for the SQL adapters."""

    def transaction(self) -> AbstractContextManager[StoreWithTenants]:
        """A store whose work commits when the block exits, or rolls back on an error."""
        ...

    def run(self, work: Callable[[StoreWithTenants], T]) -> T:
        """``work`` in a transaction."""
        ...

    def autocommit(self, work: Callable[[StoreWithTenants], T]) -> T:
        """``work`` whose writes are each one guarded statement (a claim, a lone success)."""
        ...


class InMemoryDatabase:
    """The in-memory store's unit of work. A unit holds a lock (one at a time, as SQLite's
    BEGIN IMMEDIATE has it) and, when its work raises, puts every table back as it was: the
    engine relies on its caller's rollback (a cancel that raises after cancelling nodes).
    ``tables`` is there for a test to read, row by row."""

    def __init__(self) -> None:
        self.tables = Tables()
        self._lock = threading.RLock()

    @contextmanager
    def transaction(self) -> Iterator[InMemoryStore]:
        with self._lock:
            before = self.tables.copy()
            try:
                yield InMemoryStore(self.tables)
            except BaseException:
                self.tables.restore(before)
                raise

    def run(self, work: Callable[[InMemoryStore], T]) -> T:
        with self.transaction() as store:
            return work(store)

    def autocommit(self, work: Callable[[InMemoryStore], T]) -> T:
        """As :meth:`run`: one unit, as on SQLite (PostgreSQL commits each statement alone;
        the engine only runs work here that is correct either way)."""
        return self.run(work)


_: type[UnitOfWork] = InMemoryDatabase  # mypy checks here that it is a unit of work


class Clock:
    """A test's time: it stands still until the test moves it."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def apply(
    units: UnitOfWork,
    definition: Workflow | Mapping[str, Any],
    now: datetime,
    *,
    tenant: str = DEFAULT_TENANT,
) -> WorkflowRecord:
    """Store a workflow definition for ``tenant`` (made if new) as ``conveyor workflow apply``
    does: a new version if it changed, its schedules and subscriptions made to match it."""
    workflow = parse_workflow(definition)

    def work(store: StoreWithTenants) -> WorkflowRecord:
        store.create_tenant(tenant)
        record, _ = workflows.apply_workflow(store, tenant, workflow, now)
        schedules.sync_definition(store, tenant, workflow, now)
        subscriptions.sync(store, tenant, workflow)
        return record

    return units.run(work)
