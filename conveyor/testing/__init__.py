"""Conveyor for tests: the store port in memory, for unit tests of the engine's transitions
that need no database (as procrastinate's ``InMemoryConnector`` and dramatiq's
``StubBroker``)::

    from conveyor.engine import claiming, success, triggering
    from conveyor.testing import Clock, InMemoryDatabase, apply

    db, clock = InMemoryDatabase(), Clock()
    apply(db, {"name": "hello", "nodes": [{"id": "a", "type": "python",
                                           "config": {"function": "app.a"}}]}, clock())
    made = db.run(lambda s: triggering.trigger(s, workflow_name="hello", tenant="default",
                                               input={}, now=clock()))
    run = db.autocommit(lambda s: claiming.claim_node(s, made.dispatches[0].job_id, clock()))
    db.run(lambda s: success.complete_node(s, run, {"ok": True}, clock(), 0.1))
    assert db.tables.executions[made.execution_id].status == "completed"

:class:`InMemoryStore` changes state as the SQL adapters do (only from the status it expects,
a try's outcome only while that try is current); tests/contract runs the same cases on it, on
SQLite and on PostgreSQL. See docs/testing.md.
"""

from conveyor.testing.memory_store import InMemoryStore
from conveyor.testing.tables import (
    AttemptRow,
    DeliveryRow,
    ExecutionRow,
    JobRow,
    NodeStateRow,
    Tables,
)
from conveyor.testing.units import (
    Clock,
    InMemoryDatabase,
    StoreWithTenants,
    UnitOfWork,
    apply,
)

__all__ = [
    "AttemptRow",
    "Clock",
    "DeliveryRow",
    "ExecutionRow",
    "InMemoryDatabase",
    "InMemoryStore",
    "JobRow",
    "NodeStateRow",
    "StoreWithTenants",
    "Tables",
    "UnitOfWork",
    "apply",
]
