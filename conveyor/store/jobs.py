"""The SQL of jobs and their tries, one job at a time: claims, transitions, retries, the
promotion of due jobs, what the limiter reads (part of :class:`~conveyor.store.sql_store.SqlStore`;
a node job's claim and success, which touch its node state and execution too, are in
:mod:`conveyor.store.postgres` and :mod:`conveyor.store.sqlite`)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Select,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    update,
)

from conveyor.engine.queues import EXECUTION_QUEUE, NODE_QUEUE
from conveyor.engine.records import Admission, ExecutionRecord, JobRecord, NewJob
from conveyor.engine.states import (
    ACTIVE_EXECUTION,
    PAUSED_JOB,
    RUNNABLE_JOB,
    STOPPABLE_JOB,
    WAITING_JOB,
    AttemptStatus,
    JobKind,
    JobStatus,
    Priority,
)
from conveyor.models import Job
from conveyor.store.rows import job_record
from conveyor.store.session import (
    ATTEMPTS,
    EXECUTIONS,
    JOBS,
    TENANTS,
    WORKFLOWS,
    StoreCore,
    unindexed,
)


class JobQueries(StoreCore):
    """Jobs and tries (part of :class:`~conveyor.store.sql_store.SqlStore`)."""

    # -- jobs -----------------------------------------------------------------------------

    def claim_job(self, job_id: uuid.UUID, kind: JobKind, now: datetime) -> JobRecord | None:
        """queued (or parked) -> processing; None when the job is not a runnable job of that
        kind (a duplicate or misrouted message)."""
        row = self._core(
            update(JOBS)
            .where(
                JOBS.c.id == job_id, JOBS.c.kind == kind, unindexed(JOBS.c.status).in_(RUNNABLE_JOB)
            )
            .values(status=JobStatus.PROCESSING, processed_at=now, heartbeat_at=now)
            .returning(*JOBS.c)
        ).one_or_none()
        return job_record(row) if row else None

    def job(self, job_id: uuid.UUID) -> JobRecord | None:
        row = self.session.get(Job, job_id)
        return job_record(row) if row else None

    def transition_job(
        self,
        job_id: uuid.UUID,
        expected: JobStatus,
        new: JobStatus,
        *,
        try_number: int | None = None,
        **values: Any,
    ) -> bool:
        """``expected`` -> ``new``; with ``try_number``, only while that try is the job's
        current one (see :func:`current_try`)."""
        result = self._core(
            update(JOBS)
            .where(
                JOBS.c.id == job_id,
                unindexed(JOBS.c.status) == expected,
                *current_try(try_number),
            )
            .values(status=new, **values)
        )
        return bool(result.rowcount)

    def resume_waiting(
        self, job_id: uuid.UUID, try_number: int, waiting: JobStatus = JobStatus.WAITING_CHILD
    ) -> JobRecord | None:
        row = self._core(
            update(JOBS)
            .where(
                JOBS.c.id == job_id,
                unindexed(JOBS.c.status) == waiting,
                *current_try(try_number),
            )
            .values(status=JobStatus.PROCESSING)
            .returning(*JOBS.c)
        ).one_or_none()
        return job_record(row) if row else None

    def schedule_retry(
        self, job_id: uuid.UUID, next_run_at: datetime, error: str, *, try_number: int
    ) -> bool:
        """processing -> retry_wait, while try ``try_number`` is the job's current one."""
        result = self.session.execute(
            update(Job)
            .where(
                JOBS.c.id == job_id,
                unindexed(JOBS.c.status) == JobStatus.PROCESSING,
                *current_try(try_number),
            )
            .values(
                status=JobStatus.RETRY_WAIT,
                retry_count=Job.retry_count + 1,
                next_run_at=next_run_at,
                last_error=error,
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    def schedule_snooze(self, job_id: uuid.UUID, next_run_at: datetime, *, try_number: int) -> bool:
        """processing -> retry_wait, no attempt spent: the snoozed try counts in
        ``tries_before``, as the tries before a requeue do, not in ``retry_count``."""
        result = self._core(
            update(JOBS)
            .where(
                JOBS.c.id == job_id,
                unindexed(JOBS.c.status) == JobStatus.PROCESSING,
                *current_try(try_number),
            )
            .values(
                status=JobStatus.RETRY_WAIT,
                tries_before=JOBS.c.tries_before + 1,
                next_run_at=next_run_at,
            )
        )
        return bool(result.rowcount)

    def snoozes_in_a_row(self, job_id: uuid.UUID, try_number: int) -> int:
        earlier = ATTEMPTS.c.job_id == job_id, ATTEMPTS.c.attempt_number < try_number
        last_other = (
            select(func.coalesce(func.max(ATTEMPTS.c.attempt_number), 0))
            .where(*earlier, ATTEMPTS.c.status != AttemptStatus.SNOOZED)
            .scalar_subquery()
        )
        counted = select(func.count()).where(*earlier, ATTEMPTS.c.attempt_number > last_other)
        return int(self.session.execute(counted).scalar_one())

    def promote_due(self, now: datetime, limit: int) -> list[JobRecord]:
        """Move waiting jobs whose time has come to queued, skipping rows another promoter
        holds; the caller publishes them after commit."""
        due = (
            select(Job.id)
            .where(Job.status.in_(list(WAITING_JOB)), Job.next_run_at <= now)
            .order_by(Job.next_run_at)
            .limit(limit)
        )
        still = unindexed(JOBS.c.status).in_(list(WAITING_JOB))
        return self._take(due, still, status=JobStatus.QUEUED, enqueued_at=now)

    def _take(self, due: Select[uuid.UUID], still: Any, **values: Any) -> list[JobRecord]:
        """Lock the rows ``due`` selects, skipping those another worker holds, and update
        those that still match ``still`` (a condition on the rows found by key: on
        ``unindexed`` columns)."""
        ids = list(self.session.scalars(due.with_for_update(skip_locked=True)))
        if not ids:
            return []
        rows = self.session.execute(
            update(Job)
            .where(Job.id.in_(ids), still)
            .values(**values)
            .returning(Job, _WORKFLOW_NAME),
            execution_options={"synchronize_session": False},
        ).all()
        return [job_record(job, name) for job, name in rows]

    def admission(self, job_id: uuid.UUID) -> Admission | None:
        """What the limiter needs to know about a node job, or None if there is no such job."""
        row = self._core(_ADMISSION, {"job_id": job_id}).one_or_none()
        if row is None:
            return None
        return Admission(
            job_id=job_id,
            status=row.status,
            kind=row.kind,
            tenant_id=row.tenant_id,
            workflow_id=row.workflow_id,
            priority=row.priority,
            enqueued_at=row.enqueued_at,
            tenant_concurrency=row.max_concurrency,
            node_id=row.node_id,
        )

    def job_names(self, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[str, str | None]]:
        """Each job's workflow name and node, as the messages that publish them show them."""
        statement = (
            select(JOBS.c.id, WORKFLOWS.c.name, JOBS.c.node_id)
            .join(WORKFLOWS, WORKFLOWS.c.id == JOBS.c.workflow_id)
            .where(JOBS.c.id.in_(job_ids))
        )
        return {r.id: (r.name, r.node_id) for r in self._core(statement)}

    def tenant_concurrency(self, tenant_id: uuid.UUID) -> int | None:
        """The tenant's own concurrency limit (None: the default applies)."""
        return cast(int | None, self._core(_TENANT_LIMIT, {"tenant_id": tenant_id}).scalar())

    def park_job(self, job_id: uuid.UUID) -> bool:
        """queued -> parked: the job waits for a permit without a message in the broker."""
        return self.transition_job(job_id, JobStatus.QUEUED, JobStatus.PARKED)

    def parked_jobs(self, after: uuid.UUID | None, limit: int) -> list[tuple[uuid.UUID, Priority]]:
        """Parked jobs in id order from ``after`` (a cursor, so a sweep covers them all)."""
        query = select(Job.id, Job.priority).where(Job.status == JobStatus.PARKED)
        if after is not None:
            query = query.where(Job.id > after)
        rows = self.session.execute(query.order_by(Job.id).limit(limit)).all()
        return [(r.id, r.priority) for r in rows]

    def age_queued(self, cutoff: datetime, limit: int) -> list[JobRecord]:
        """Low jobs queued since before ``cutoff`` become normal; the caller re-publishes
        them at normal priority (the old message finds the job taken and is dropped)."""
        due = (
            select(Job.id)
            .where(
                Job.status == JobStatus.QUEUED,
                Job.priority == Priority.LOW,
                Job.enqueued_at < cutoff,
            )
            .limit(limit)
        )
        still = unindexed(JOBS.c.status) == JobStatus.QUEUED
        return self._take(due, still, priority=Priority.NORMAL)

    # -- attempts -------------------------------------------------------------------------

    def add_attempt(self, job: JobRecord, worker: str | None, now: datetime) -> None:
        """The row of the try a claim of ``job`` starts, with how long the job waited."""
        waited = (now - job.enqueued_at).total_seconds() if job.enqueued_at else None
        self._core(
            insert(ATTEMPTS).values(
                job_id=job.id,
                attempt_number=job.try_number,
                status=AttemptStatus.RUNNING,
                worker=worker,
                started_at=now,
                waited=max(0.0, waited) if waited is not None else None,
                queue=job.queue,
                workflow_id=job.workflow_id,
            )
        )

    def finish_attempt(
        self,
        job_id: uuid.UUID,
        number: int,
        status: AttemptStatus,
        now: datetime,
        duration: float,
        *,
        error: str | None = None,
        timed_out: bool = False,
        traceback: str | None = None,
    ) -> None:
        self._core(
            update(ATTEMPTS)
            .where(ATTEMPTS.c.job_id == job_id, ATTEMPTS.c.attempt_number == number)
            .values(
                status=status, finished_at=now, duration=duration, error=error,
                timed_out=timed_out, traceback=traceback,
            )
        )  # fmt: skip


# A new job's row, but for its execution_id: a node job's, an execution's start job's.


def node_job_row(execution: ExecutionRecord, job: NewJob, now: datetime) -> dict[str, Any]:
    return {
        "id": job.id, "kind": JobKind.NODE, "queue": NODE_QUEUE, "data": {},
        "status": JobStatus.SCHEDULED if job.next_run_at else JobStatus.QUEUED,
        "priority": execution.priority, "max_retries": job.max_retries, "retry_count": 0,
        "tries_before": 0, "tenant_id": execution.tenant_id,
        "workflow_id": execution.workflow_id, "node_id": job.node_id,
        "next_run_at": job.next_run_at, "created_at": now, "enqueued_at": now,
    }  # fmt: skip


def start_job_row(execution: ExecutionRecord, job_id: uuid.UUID, now: datetime) -> dict[str, Any]:
    """Queued, or held until the execution's ``scheduled_for`` (a trigger's ``run_at``)."""
    later = execution.scheduled_for if starts_later(execution, now) else None
    return {
        "id": job_id, "kind": JobKind.EXECUTION, "queue": EXECUTION_QUEUE, "data": {},
        "status": JobStatus.SCHEDULED if later else JobStatus.QUEUED,
        "priority": execution.priority, "max_retries": 0,
        "retry_count": 0, "tries_before": 0, "tenant_id": execution.tenant_id,
        "workflow_id": execution.workflow_id, "node_id": None, "next_run_at": later,
        "created_at": now, "enqueued_at": now,
    }  # fmt: skip


def starts_later(execution: ExecutionRecord, now: datetime) -> bool:
    """A trigger's execution whose start job waits for its ``run_at``."""
    return execution.scheduled_for is not None and execution.scheduled_for > now


# Built once (their construction cost more than their execution).
# A job's workflow name, returned by the statement that hands the job out (UPDATE ...
# RETURNING): its message is named by it. (SQLite's RETURNING drops the table names: ``id``
# is the workflow's, the innermost table's, and ``workflow_id`` the job's, the only one.)
_WORKFLOW_NAME = (
    select(WORKFLOWS.c.name).where(WORKFLOWS.c.id == JOBS.c.workflow_id).scalar_subquery()
)
_ADMISSION = (
    select(
        JOBS.c.status,
        JOBS.c.kind,
        JOBS.c.tenant_id,
        JOBS.c.workflow_id,
        JOBS.c.priority,
        JOBS.c.enqueued_at,
        JOBS.c.node_id,
        TENANTS.c.max_concurrency,
    )
    .join(TENANTS, TENANTS.c.id == JOBS.c.tenant_id)
    .where(JOBS.c.id == bindparam("job_id"))
)
_TENANT_LIMIT = select(TENANTS.c.max_concurrency).where(TENANTS.c.id == bindparam("tenant_id"))


def current_try(try_number: int | None) -> list[ColumnElement[bool]]:
    """The job's current try is ``try_number``: a try's outcome settles its job only while no
    later try began. A worker that missed its heartbeats may end after its job was reclaimed
    and claimed again by another worker; its outcome is then not the job's."""
    if try_number is None:
        return []
    return [JOBS.c.tries_before + JOBS.c.retry_count + 1 == try_number]


def execution_runs(execution_id: uuid.UUID) -> ColumnElement[bool]:
    """The execution is still pending or running: a try's success is recorded as its job's
    only then (one that ends after its execution did is recorded cancelled instead)."""
    return (
        select(EXECUTIONS.c.status)
        .where(EXECUTIONS.c.id == execution_id)
        .scalar_subquery()
        .in_(ACTIVE_EXECUTION)
    )


# Held jobs, as the partial index ix_jobs_held has them: the status a literal, not a parameter,
# so that a prepared statement's generic plan can still prove it uses that index.
HELD = JOBS.c.status == literal_column("'held'")


def cancel_unstarted_jobs(
    store: StoreCore, where: list[ColumnElement[bool]], now: datetime
) -> list[uuid.UUID]:
    """Cancel the jobs ``where`` selects that have not started: the held map items first (one
    statement on their index, not returned: no message, no permit ever had them), then those
    waiting for a child (their tries ended, :func:`_end_waits`), then those queued, parked or
    waiting for their time; the node jobs among the latter two (the limiter may know them). A
    rerun's held node job stays held: a requeue of the dead letter that failed the execution
    resumes it, and its node runs once its needs settle."""
    cancelled = {"status": JobStatus.CANCELLED, "completed_at": now}
    store._core(update(JOBS).where(*where, HELD, JOBS.c.item_index.is_not(None)).values(cancelled))
    waited = _end_waits(store, where, now)
    rows = store._core(
        update(JOBS)
        .where(*where, JOBS.c.status.in_(STOPPABLE_JOB))
        .values(cancelled)
        .returning(JOBS.c.id, JOBS.c.kind)
    ).all()
    return waited + [r.id for r in rows if r.kind is JobKind.NODE]


def _end_waits(
    store: StoreCore, where: list[ColumnElement[bool]], now: datetime
) -> list[uuid.UUID]:
    """The jobs ``where`` selects that wait for a child or an event, cancelled, and the try
    each waits in ended ``cancelled`` with them: its attempt, started by the claim, would
    stay ``running`` (the caller stops the children, whose finish then settles nothing; a
    wait's row is left to the retention sweep, and an event finds its job no longer
    waiting)."""
    waits = store._core(
        update(JOBS)
        .where(*where, JOBS.c.status.in_(PAUSED_JOB))
        .values(status=JobStatus.CANCELLED, completed_at=now)
        .returning(
            JOBS.c.id,
            (JOBS.c.tries_before + JOBS.c.retry_count + 1).label("try_number"),
            JOBS.c.processed_at,  # when its claim started the try
        )
    ).all()
    if waits:
        store._core(
            update(ATTEMPTS)
            .where(
                ATTEMPTS.c.job_id == bindparam("waiting_job"),
                ATTEMPTS.c.attempt_number == bindparam("waiting_try"),
                ATTEMPTS.c.status == AttemptStatus.RUNNING,
            )
            .values(status=AttemptStatus.CANCELLED, finished_at=now, duration=bindparam("took")),
            [
                {
                    "waiting_job": w.id,
                    "waiting_try": w.try_number,
                    "took": _took(w.processed_at, now),
                }
                for w in waits
            ],
        )
    return [w.id for w in waits]


def _took(started: datetime | None, now: datetime) -> float | None:
    return max(0.0, (now - started).total_seconds()) if started is not None else None
