"""The SQL of wait nodes and the application events that wake them (part of
:class:`SqlStore`). The correlation lock is each adapter's own (:meth:`lock_correlation`)."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Table,
    and_,
    delete,
    exists,
    func,
    insert,
    select,
)
from sqlalchemy.orm import Session

from conveyor.engine.records import EventRecord, WaitRecord
from conveyor.engine.states import JobStatus
from conveyor.models import Event, Wait
from conveyor.store.session import EXECUTIONS, JOBS

EVENTS = cast(Table, Event.__table__)
WAITS = cast(Table, Wait.__table__)


def _wait(row: Any) -> WaitRecord:
    return WaitRecord(**{name: getattr(row, name) for name in WAITS.c.keys()})  # noqa: SIM118


class WaitQueries:
    session: Session

    def add_event(self, event: EventRecord) -> None:
        self.session.execute(insert(EVENTS).values(**asdict(event)))

    def first_event(
        self,
        tenant_id: uuid.UUID,
        event: str,
        key: str,
        since: datetime,
        now: datetime,
        *,
        execution_id: uuid.UUID | None = None,
    ) -> EventRecord | None:
        # The execution's events_since when the database stamped it (PostgreSQL), else since.
        start: ColumnElement[datetime] | datetime = since
        if execution_id is not None:
            stamped = select(EXECUTIONS.c.events_since).where(EXECUTIONS.c.id == execution_id)
            start = func.coalesce(stamped.scalar_subquery(), since)
        row = self.session.execute(
            select(EVENTS)
            .where(
                EVENTS.c.tenant_id == tenant_id,
                EVENTS.c.name == event,
                EVENTS.c.key == key,
                EVENTS.c.created_at >= start,
                EVENTS.c.expires_at > now,
            )
            .order_by(EVENTS.c.created_at, EVENTS.c.id)
            .limit(1)
        ).one_or_none()
        if row is None:
            return None
        return EventRecord(**{name: getattr(row, name) for name in EVENTS.c.keys()})  # noqa: SIM118

    def add_wait(self, wait: WaitRecord) -> None:
        self.session.execute(delete(WAITS).where(WAITS.c.job_id == wait.job_id))
        self.session.execute(insert(WAITS).values(**asdict(wait)))

    def waits_for(self, tenant_id: uuid.UUID, event: str, key: str) -> list[WaitRecord]:
        rows = self.session.execute(
            select(WAITS)
            .where(WAITS.c.tenant_id == tenant_id, WAITS.c.event == event, WAITS.c.key == key)
            .order_by(WAITS.c.created_at, WAITS.c.job_id)
        )
        return [_wait(row) for row in rows]

    def pending_waits(self, tenant_id: uuid.UUID | None, event: str) -> list[WaitRecord]:
        waiting = and_(JOBS.c.id == WAITS.c.job_id, JOBS.c.status == JobStatus.WAITING_EVENT)
        query = select(WAITS).join(JOBS, waiting).where(WAITS.c.event == event)
        if tenant_id is not None:
            query = query.where(WAITS.c.tenant_id == tenant_id)
        rows = self.session.execute(query.order_by(WAITS.c.created_at, WAITS.c.job_id))
        return [_wait(row) for row in rows]

    def execution_waits(self, execution_id: uuid.UUID) -> list[WaitRecord]:
        """The wait nodes of an execution waiting for their event now (for its page)."""
        rows = self.session.execute(
            select(WAITS).where(WAITS.c.execution_id == execution_id).order_by(WAITS.c.node_id)
        )
        return [_wait(row) for row in rows]

    def end_wait(self, job_id: uuid.UUID) -> None:
        self.session.execute(delete(WAITS).where(WAITS.c.job_id == job_id))

    def due_waits(self, now: datetime, limit: int) -> list[WaitRecord]:
        rows = self.session.execute(
            select(WAITS)
            .where(WAITS.c.timeout_at.is_not(None), WAITS.c.timeout_at <= now)
            .order_by(WAITS.c.timeout_at, WAITS.c.job_id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [_wait(row) for row in rows]

    def wait_ages(self, now: datetime, bounds: tuple[float, ...]) -> tuple[list[int], float]:
        """How many waits wait (their job ``waiting_event``) for at most each of ``bounds``
        seconds (cumulative), all of them last; and the oldest one's age in seconds (0: none)."""
        waiting = and_(JOBS.c.id == WAITS.c.job_id, JOBS.c.status == JobStatus.WAITING_EVENT)
        since = [now - timedelta(seconds=b) for b in bounds]
        row = self.session.execute(
            select(
                *(func.count().filter(WAITS.c.created_at >= s) for s in since),
                func.count(),
                func.min(WAITS.c.created_at),
            ).select_from(WAITS.join(JOBS, waiting))
        ).one()
        oldest = cast(datetime | None, row[-1])
        age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
        return [int(n) for n in row[:-1]], age

    def drop_expired_events(self, now: datetime, limit: int) -> int:
        expired = (
            select(EVENTS.c.id)
            .where(EVENTS.c.expires_at <= now)
            .order_by(EVENTS.c.expires_at)
            .limit(limit)
        )
        dropped = cast(
            CursorResult[Any], self.session.execute(delete(EVENTS).where(EVENTS.c.id.in_(expired)))
        )
        waiting = exists().where(
            JOBS.c.id == WAITS.c.job_id, JOBS.c.status == JobStatus.WAITING_EVENT
        )
        self.session.execute(delete(WAITS).where(~waiting))
        return int(dropped.rowcount or 0)
