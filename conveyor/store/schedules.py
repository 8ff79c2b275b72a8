"""The SQL of cron schedules and of the runs they start (part of :class:`SqlStore`).

The due check locks the schedules whose slot has come with ``FOR UPDATE SKIP LOCKED``, so
checks running at once share the work instead of repeating it, and inserts each run with
``ON CONFLICT DO NOTHING`` on the (schedule, slot) unique index, so that a fire can never be
stored twice whatever the locks missed.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from conveyor.engine.queues import EXECUTION_QUEUE
from conveyor.engine.records import Advance, Fire, ScheduleRecord, WorkflowRecord
from conveyor.engine.states import (
    ExecutionStatus,
    JobKind,
    JobStatus,
    TriggerSource,
)
from conveyor.exceptions import ScheduleError
from conveyor.ids import new_id
from conveyor.models import Execution, Job, Schedule, WorkflowVersion
from conveyor.store.rows import schedule_record, workflow_record
from conveyor.store.session import upsert


class ScheduleQueries:
    session: Session

    def add_schedule(self, **values: Any) -> ScheduleRecord:
        """Insert a schedule; :class:`ScheduleError` if its tenant already has the name."""
        row = Schedule(**values)
        try:
            with self.session.begin_nested():
                self.session.add(row)
        except IntegrityError as exc:
            raise ScheduleError(
                f"a schedule named {values['name']!r} exists already; pick another name, "
                f"or remove it first (`conveyor schedules remove {values['name']}`)"
            ) from exc
        return schedule_record(row)

    def schedule(self, tenant_id: uuid.UUID, name: str) -> ScheduleRecord | None:
        row = self.session.scalar(
            select(Schedule).where(Schedule.tenant_id == tenant_id, Schedule.name == name)
        )
        return schedule_record(row) if row else None

    def schedules(
        self, tenant_id: uuid.UUID | None, *, workflow: str | None = None
    ) -> list[ScheduleRecord]:
        query = select(Schedule).order_by(Schedule.name)
        if tenant_id is not None:
            query = query.where(Schedule.tenant_id == tenant_id)
        if workflow is not None:
            query = query.where(Schedule.workflow_name == workflow)
        return [schedule_record(r) for r in self.session.scalars(query)]

    def update_schedule(self, schedule_id: uuid.UUID, now: datetime, **values: Any) -> None:
        self.session.execute(
            update(Schedule).where(Schedule.id == schedule_id).values(updated_at=now, **values)
        )

    def delete_schedules(self, ids: Collection[uuid.UUID]) -> None:
        if ids:
            self.session.execute(delete(Schedule).where(Schedule.id.in_(list(ids))))

    def claim_due_schedules(self, now: datetime, limit: int) -> list[ScheduleRecord]:
        """Lock enabled schedules whose next slot has come, oldest first, skipping those
        another check holds; the lock lasts until the caller's transaction ends."""
        rows = self.session.scalars(
            select(Schedule)
            .where(Schedule.enabled.is_(True), Schedule.next_run_at <= now)
            .order_by(Schedule.next_run_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [schedule_record(r) for r in rows]

    def latest_workflows(
        self, keys: Collection[tuple[uuid.UUID, str]]
    ) -> dict[tuple[uuid.UUID, str], WorkflowRecord]:
        """The latest version of each (tenant, workflow name) that has one."""
        if not keys:
            return {}
        newest = (
            select(
                WorkflowVersion.tenant_id,
                WorkflowVersion.name,
                func.max(WorkflowVersion.version).label("v"),
            )
            .where(tuple_(WorkflowVersion.tenant_id, WorkflowVersion.name).in_(list(keys)))
            .group_by(WorkflowVersion.tenant_id, WorkflowVersion.name)
            .subquery()
        )
        rows = self.session.scalars(
            select(WorkflowVersion).join(
                newest,
                (WorkflowVersion.tenant_id == newest.c.tenant_id)
                & (WorkflowVersion.name == newest.c.name)
                & (WorkflowVersion.version == newest.c.v),
            )
        )
        return {(r.tenant_id, r.name): workflow_record(r) for r in rows}

    def add_fired_executions(
        self, fires: Sequence[Fire], now: datetime
    ) -> list[tuple[Fire, uuid.UUID]]:
        """Insert each fire's execution and start job; the new fires, each with its start
        job's id (a fire that is stored already is left alone)."""
        if not fires:
            return []
        ids = {(f.schedule.id, f.slot): new_id() for f in fires}
        stored = self.session.execute(
            upsert(self.session, Execution)
            .on_conflict_do_nothing()
            .returning(Execution.schedule_id, Execution.scheduled_for),
            [
                {
                    "id": ids[f.schedule.id, f.slot],
                    "tenant_id": f.schedule.tenant_id,
                    "workflow_id": f.workflow_id,
                    "status": ExecutionStatus.PENDING,
                    "priority": f.priority,
                    "trigger": TriggerSource.SCHEDULE.value,
                    "input": f.schedule.input,
                    "remaining_nodes": 0,
                    "schedule_id": f.schedule.id,
                    "scheduled_for": f.slot,
                    "created_at": now,
                    "traceparent": f.trace.traceparent if f.trace else None,
                    "tracestate": f.trace.tracestate if f.trace else None,
                }
                for f in fires
            ],
        ).all()
        new = set(map(tuple, stored))
        started = [(f, new_id()) for f in fires if (f.schedule.id, f.slot) in new]
        if started:
            self.session.execute(
                insert(Job),
                [
                    {
                        "id": job_id,
                        "kind": JobKind.EXECUTION,
                        "queue": EXECUTION_QUEUE,
                        "data": {},
                        "status": JobStatus.QUEUED,
                        "priority": f.priority,
                        "max_retries": 0,
                        "retry_count": 0,
                        "tenant_id": f.schedule.tenant_id,
                        "workflow_id": f.workflow_id,
                        "execution_id": ids[f.schedule.id, f.slot],
                        "created_at": now,
                        "enqueued_at": now,
                    }
                    for f, job_id in started
                ],
            )
        return started

    def advance_schedules(self, advances: Sequence[Advance], now: datetime) -> None:
        """Move each checked schedule to its next slot and count the runs it started."""
        if not advances:
            return
        table = cast(Table, Schedule.__table__)
        self.session.execute(
            update(table)
            .where(table.c.id == bindparam("sid"))
            .values(
                next_run_at=bindparam("next"),
                run_count=table.c.run_count + bindparam("started"),
                last_run_at=func.coalesce(
                    bindparam("last", type_=table.c.last_run_at.type), table.c.last_run_at
                ),
                updated_at=now,
            ),
            [
                {
                    "sid": a.schedule_id,
                    "next": a.next_run_at,
                    "started": a.started,
                    "last": now if a.started else None,
                }
                for a in advances
            ],
        )
