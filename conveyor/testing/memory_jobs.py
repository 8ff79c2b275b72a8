"""Jobs, their tries and dead letters in memory (part of
:class:`~conveyor.testing.InMemoryStore`): a job changes only from the status it expects and,
given a try number, only while that try is its current one."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from conveyor.engine.records import ExecutionRecord, Finish, JobRecord, NewJob
from conveyor.engine.states import (
    ACTIVE_EXECUTION,
    RUNNABLE_JOB,
    WAITING_JOB,
    AttemptStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
    priorities_above,
)
from conveyor.exceptions import DuplicateExecution, StoreError
from conveyor.testing.memory_executions import MemoryExecutions
from conveyor.testing.tables import AttemptRow, JobRow


class MemoryJobs(MemoryExecutions):
    """Jobs and tries: claimed, recorded, retried, promoted when due."""

    def job(self, job_id: uuid.UUID) -> JobRecord | None:
        row = self.tables.jobs.get(job_id)
        return row.record() if row else None

    def add_node_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> None:
        for job in jobs:
            self._add_node_job(execution, job, now)

    def claim_job(self, job_id: uuid.UUID, kind: JobKind, now: datetime) -> JobRecord | None:
        row = self.tables.jobs.get(job_id)
        if row is None or row.kind is not kind or row.status not in RUNNABLE_JOB:
            return None
        return self._set_job(
            row, status=JobStatus.PROCESSING, processed_at=now, heartbeat_at=now
        ).record()

    def claim_node_job(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        job = self.claim_job(job_id, JobKind.NODE, now)
        if job is None or job.node_id is None:
            return None
        execution = self.execution(job.execution_id)
        if not input:
            execution = replace(execution, input=None)
        if execution.status.finished:
            return job, execution, None
        self.add_attempt(job, worker, now)
        if job.item_index is None:  # a map's item leaves its node (the map's counter) alone
            self.start_node(execution.id, job.node_id, now)
        if not needs:
            return job, execution, None
        rows = self.node_rows(execution.id, needs)
        return job, execution, {need: row.output for need, row in rows.items()}

    def claim_continuation(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        *,
        queue: str,
        priority: Priority,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        above = priorities_above(priority)
        if any(
            row.status is JobStatus.QUEUED and row.priority in above and row.queue == queue
            and row.kind is JobKind.NODE
            for row in self.tables.jobs.values()
        ):  # fmt: skip
            return None
        return self.claim_node_job(job_id, now, worker, needs=needs, input=input)

    def complete_running(
        self,
        job: JobRecord,
        node_id: str,
        *,
        output: Any,
        branch: str | None,
        now: datetime,
        duration: float,
        successors: Sequence[str] | None = None,
        finish: Finish | None = None,
    ) -> bool:
        row = self.tables.jobs.get(job.id)
        execution = self._execution_row(job.execution_id)
        if (
            row is None
            or row.status is not JobStatus.PROCESSING
            or row.try_number != job.try_number
            or execution is None
            or execution.status not in ACTIVE_EXECUTION
            or (successors and not self._none_made_ready(job.execution_id, successors))
        ):
            return False
        self._set_job(row, status=JobStatus.COMPLETED, completed_at=now, last_error=None)
        self.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
        self.set_node(
            job.execution_id, node_id, NodeStatus.COMPLETED, output=output, branch=branch,
            finished_at=now, error=None,
        )  # fmt: skip
        if successors is None:
            return True
        if successors:
            self.decrement_waiting(job.execution_id, sorted(successors))
        self.settle_nodes(job.execution_id, 1, finish)
        return True

    def _none_made_ready(self, execution_id: uuid.UUID, successors: Sequence[str]) -> bool:
        """Whether each successor still waits on another node (none settled meanwhile)."""
        found = (self.tables.node_states.get((execution_id, s)) for s in successors)
        return all(
            n.waiting_on > 1 and n.status is NodeStatus.PENDING for n in found if n is not None
        )

    def add_attempt(self, job: JobRecord, worker: str | None, now: datetime) -> None:
        waited = (now - job.enqueued_at).total_seconds() if job.enqueued_at else None
        if (job.id, job.try_number) in self.tables.attempts:
            raise StoreError(f"job {job.id} has an attempt {job.try_number} already")
        self.tables.attempts[job.id, job.try_number] = AttemptRow(
            job_id=job.id, attempt_number=job.try_number, status=AttemptStatus.RUNNING,
            worker=worker, started_at=now, waited=max(0.0, waited) if waited is not None else None,
            queue=job.queue, workflow_id=job.workflow_id,
        )  # fmt: skip

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
        if (attempt := self.tables.attempts.get((job_id, number))) is None:
            return
        self.tables.attempts[job_id, number] = replace(
            attempt, status=status, finished_at=now, duration=duration, error=error,
            timed_out=timed_out, traceback=traceback,
        )  # fmt: skip

    def transition_job(
        self,
        job_id: uuid.UUID,
        expected: JobStatus,
        new: JobStatus,
        *,
        try_number: int | None = None,
        **values: Any,
    ) -> bool:
        row = self._current(job_id, expected, try_number)
        if row is None:
            return False
        self._set_job(row, status=new, **values)
        return True

    def resume_waiting(
        self, job_id: uuid.UUID, try_number: int, waiting: JobStatus = JobStatus.WAITING_CHILD
    ) -> JobRecord | None:
        row = self._current(job_id, waiting, try_number)
        if row is None:
            return None
        return self._set_job(row, status=JobStatus.PROCESSING).record()

    def schedule_retry(
        self, job_id: uuid.UUID, next_run_at: datetime, error: str, *, try_number: int
    ) -> bool:
        row = self._current(job_id, JobStatus.PROCESSING, try_number)
        if row is None:
            return False
        self._set_job(
            row, status=JobStatus.RETRY_WAIT, retry_count=row.retry_count + 1,
            next_run_at=next_run_at, last_error=error,
        )  # fmt: skip
        return True

    def schedule_snooze(self, job_id: uuid.UUID, next_run_at: datetime, *, try_number: int) -> bool:
        row = self._current(job_id, JobStatus.PROCESSING, try_number)
        if row is None:
            return False
        self._set_job(
            row, status=JobStatus.RETRY_WAIT, tries_before=row.tries_before + 1,
            next_run_at=next_run_at,
        )  # fmt: skip
        return True

    def snoozes_in_a_row(self, job_id: uuid.UUID, try_number: int) -> int:
        count = 0
        for number in range(try_number - 1, 0, -1):
            attempt = self.tables.attempts.get((job_id, number))
            if attempt is None or attempt.status is not AttemptStatus.SNOOZED:
                break
            count += 1
        return count

    def _current(
        self, job_id: uuid.UUID, status: JobStatus, try_number: int | None
    ) -> JobRow | None:
        """The job, if it has ``status`` and (given one) ``try_number`` is its current try."""
        row = self.tables.jobs.get(job_id)
        if row is None or row.status is not status:
            return None
        if try_number is not None and row.try_number != try_number:
            return None
        return row

    def promote_due(self, now: datetime, limit: int) -> list[JobRecord]:
        due = sorted(
            (j for j in self.tables.jobs.values()
             if j.status in WAITING_JOB and j.next_run_at is not None and j.next_run_at <= now),
            key=lambda j: j.next_run_at or now,
        )[:limit]  # fmt: skip
        return [self._named(self._set_job(j, status=JobStatus.QUEUED, enqueued_at=now))
                for j in due]  # fmt: skip

    def age_queued(self, cutoff: datetime, limit: int) -> list[JobRecord]:
        low = sorted(
            (j for j in self.tables.jobs.values()
             if j.status is JobStatus.QUEUED and j.priority is Priority.LOW
             and j.enqueued_at < cutoff),
            key=lambda j: j.enqueued_at,
        )[:limit]  # fmt: skip
        return [self._named(self._set_job(j, priority=Priority.NORMAL)) for j in low]

    def _named(self, row: JobRow) -> JobRecord:
        """The job's record with its workflow's name, as the SQL statements return it."""
        return replace(row.record(), workflow=self.tables.workflows[row.workflow_id].name)


class MemoryDeadLetters(MemoryJobs):
    """Node jobs that exhausted their tries: requeued (the execution resumes) or discarded."""

    def dead_letter(self, job_id: uuid.UUID, tenant_id: uuid.UUID | None) -> JobRecord | None:
        row = self.tables.jobs.get(job_id)
        if (
            row is None
            or row.kind is not JobKind.NODE
            or row.status not in (JobStatus.DEAD_LETTER, JobStatus.DISCARDED)
            or (tenant_id is not None and row.tenant_id != tenant_id)
        ):
            return None
        return row.record()

    def has_discarded(self, execution_id: uuid.UUID) -> bool:
        return any(
            j.execution_id == execution_id and j.status is JobStatus.DISCARDED
            for j in self.tables.jobs.values()
        )

    def revive_execution(
        self,
        execution_id: uuid.UUID,
        finished: Collection[ExecutionStatus] = (ExecutionStatus.FAILED,),
    ) -> bool:
        row = self._execution_row(execution_id)
        if row is None or row.status not in finished:
            return False
        if row.dedupe_key is not None and self._key_taken(row.tenant_id, None, row.dedupe_key):
            raise DuplicateExecution(
                f"execution {execution_id}: its deduplication key is active on another execution"
            )
        self._set_execution(
            row, status=ExecutionStatus.RUNNING, error=None, finished_at=None, output=None
        )
        return True

    def revive_jobs(
        self, execution_id: uuid.UUID, now: datetime, keep: Collection[str]
    ) -> list[JobRecord]:
        stopped = (JobStatus.DEAD_LETTER, JobStatus.CANCELLED)
        revived = []
        for job in list(self.tables.jobs.values()):
            if (
                job.execution_id != execution_id
                or job.kind is not JobKind.NODE
                or job.status not in stopped
                or job.node_id in keep
                or job.item_index is not None  # a requeue does not resume a map
            ):
                continue
            later = job.next_run_at is not None and job.next_run_at > now
            tried = sum(1 for job_id, _ in self.tables.attempts if job_id == job.id)
            revived.append(self._set_job(
                job, status=JobStatus.SCHEDULED if later else JobStatus.QUEUED,
                tries_before=tried, retry_count=0, next_run_at=job.next_run_at if later else None,
                completed_at=None, enqueued_at=now,
            ).record())  # fmt: skip
        return revived

    def revive_nodes(
        self, execution_id: uuid.UUID, queued: Collection[str], keep: Collection[str]
    ) -> None:
        cleared: dict[str, Any] = {"error": None, "finished_at": None, "output": None,
                                   "branch": None}  # fmt: skip
        for node in self._nodes_of(execution_id):
            if (
                node.status in (NodeStatus.FAILED, NodeStatus.CANCELLED)
                and node.node_id not in keep
            ):
                status = NodeStatus.QUEUED if node.node_id in queued else NodeStatus.PENDING
                self._set_node(node, status=status, **cleared)

    def recount(self, execution_id: uuid.UUID, waiting_on: dict[str, int], remaining: int) -> None:
        for node_id, count in waiting_on.items():
            if (node := self.tables.node_states.get((execution_id, node_id))) is not None:
                self._set_node(node, waiting_on=count)
        if (row := self._execution_row(execution_id)) is not None:
            self._set_execution(row, remaining_nodes=remaining)

    def discard_dead_letter(self, job_id: uuid.UUID, now: datetime) -> bool:
        return self.transition_job(
            job_id, JobStatus.DEAD_LETTER, JobStatus.DISCARDED, completed_at=now
        )
