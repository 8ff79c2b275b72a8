"""The rows of a SQL adapter (PostgreSQL or SQLite) as the in-memory store's row types, so that
a contract case compares what any adapter stored alike."""

from __future__ import annotations

import uuid
from dataclasses import fields
from typing import Any, TypeVar, cast

from sqlalchemy import Table, func, select

from conveyor.models import Execution, Job, JobAttempt, NodeState, WebhookDelivery
from conveyor.store import Database
from conveyor.testing import AttemptRow, DeliveryRow, ExecutionRow, JobRow, NodeStateRow

R = TypeVar("R", AttemptRow, DeliveryRow, ExecutionRow, JobRow, NodeStateRow)


def _read(db: Database, row_type: type[R], model: Any, *where: Any) -> list[R]:
    """Rows of ``model``'s table, the columns named as ``row_type``'s fields."""
    table = cast(Table, model.__table__)
    names = [f.name for f in fields(row_type)]
    with db.transaction() as store:
        found = store.session.execute(select(*(table.c[n] for n in names)).where(*where)).all()
    return [row_type(**dict(zip(names, r, strict=True))) for r in found]


class SqlProbe:
    def __init__(self, db: Database) -> None:
        self.db = db

    def execution(self, execution_id: uuid.UUID) -> ExecutionRow:
        (found,) = _read(self.db, ExecutionRow, Execution, Execution.id == execution_id)
        return found

    def nodes(self, execution_id: uuid.UUID) -> dict[str, NodeStateRow]:
        found = _read(self.db, NodeStateRow, NodeState, NodeState.execution_id == execution_id)
        return {n.node_id: n for n in found}

    def jobs(self, execution_id: uuid.UUID) -> list[JobRow]:
        return _read(self.db, JobRow, Job, Job.execution_id == execution_id)

    def job(self, job_id: uuid.UUID) -> JobRow:
        (found,) = _read(self.db, JobRow, Job, Job.id == job_id)
        return found

    def delivery(self, delivery_id: uuid.UUID) -> DeliveryRow:
        (found,) = _read(self.db, DeliveryRow, WebhookDelivery, WebhookDelivery.id == delivery_id)
        return found

    def attempts(self, job_id: uuid.UUID) -> list[AttemptRow]:
        found = _read(self.db, AttemptRow, JobAttempt, JobAttempt.job_id == job_id)
        return sorted(found, key=lambda a: a.attempt_number)

    def counts(self) -> dict[str, int]:
        with self.db.transaction() as store:
            return {
                model.__tablename__: store.session.scalar(select(func.count()).select_from(model))
                for model in (Execution, NodeState, Job, JobAttempt)
            }
