"""Wait nodes and the events that wake them, in memory (the ``events`` and ``waits`` tables)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime

from conveyor.engine.records import EventRecord, WaitRecord
from conveyor.engine.states import JobStatus
from conveyor.testing.tables import Tables, stored


class MemoryWaits:
    tables: Tables

    def lock_correlation(self, tenant_id: uuid.UUID, event: str, key: str) -> None:
        """Nothing to take: the in-memory units of work run one at a time."""

    def add_event(self, event: EventRecord) -> None:
        self.tables.events[event.id] = replace(event, payload=stored(event.payload))

    def first_event(
        self,
        tenant_id: uuid.UUID,
        event: str,
        key: str,
        since: datetime,
        now: datetime,
        *,
        execution_id: uuid.UUID | None = None,  # one clock here: since is the execution's
    ) -> EventRecord | None:
        found = [
            e
            for e in self.tables.events.values()
            if (e.tenant_id, e.name, e.key) == (tenant_id, event, key)
            and e.created_at >= since
            and e.expires_at > now
        ]
        return min(found, key=lambda e: (e.created_at, e.id), default=None)

    def add_wait(self, wait: WaitRecord) -> None:
        self.tables.waits[wait.job_id] = wait

    def waits_for(self, tenant_id: uuid.UUID, event: str, key: str) -> list[WaitRecord]:
        found = [
            w
            for w in self.tables.waits.values()
            if (w.tenant_id, w.event, w.key) == (tenant_id, event, key)
        ]
        return sorted(found, key=lambda w: (w.created_at, w.job_id))

    def pending_waits(self, tenant_id: uuid.UUID | None, event: str) -> list[WaitRecord]:
        found = [
            w
            for w in self.tables.waits.values()
            if w.event == event
            and tenant_id in (None, w.tenant_id)
            and (job := self.tables.jobs.get(w.job_id)) is not None
            and job.status is JobStatus.WAITING_EVENT
        ]
        return sorted(found, key=lambda w: (w.created_at, w.job_id))

    def end_wait(self, job_id: uuid.UUID) -> None:
        self.tables.waits.pop(job_id, None)

    def due_waits(self, now: datetime, limit: int) -> list[WaitRecord]:
        due = [
            w
            for w in self.tables.waits.values()
            if w.timeout_at is not None and w.timeout_at <= now
        ]
        return sorted(due, key=lambda w: (w.timeout_at or now, w.job_id))[:limit]

    def drop_expired_events(self, now: datetime, limit: int) -> int:
        expired = sorted(
            (e for e in self.tables.events.values() if e.expires_at <= now),
            key=lambda e: e.expires_at,
        )[:limit]
        for e in expired:
            del self.tables.events[e.id]
        for job_id in list(self.tables.waits):
            job = self.tables.jobs.get(job_id)
            if job is None or job.status is not JobStatus.WAITING_EVENT:
                del self.tables.waits[job_id]
        return len(expired)
