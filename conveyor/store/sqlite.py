"""The SQLite adapter of the store port (the embedded default): the transitions PostgreSQL runs
as one statement each, here as the few statements they are made of. Every SQLite transaction
takes the write lock at its start (BEGIN IMMEDIATE, :mod:`conveyor.store.engines`), so a read
followed by a write inside one sees nothing change in between."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, insert, select, update

from conveyor.engine.records import Created, ExecutionRecord, Finish, JobRecord, NewJob
from conveyor.engine.states import (
    AttemptStatus,
    JobKind,
    JobStatus,
    NodeStatus,
)
from conveyor.exceptions import DuplicateExecution
from conveyor.store.jobs import current_try, execution_runs, node_job_row, start_job_row
from conveyor.store.session import JOBS, NODE_STATES
from conveyor.store.sql_store import SqlStore


class SqliteStore(SqlStore):
    """The store on SQLite, over one session."""

    def lock_applies(self, tenant_id: uuid.UUID) -> None:
        """Nothing to take: a transaction holds SQLite's one write lock from its start
        (BEGIN IMMEDIATE)."""

    def lock_correlation(self, tenant_id: uuid.UUID, event: str, key: str) -> None:
        """Nothing to take: a transaction holds SQLite's one write lock from its start
        (BEGIN IMMEDIATE), so a wait's start and its event's arrival take turns."""

    def _nodes_among(self, node_ids: Iterable[str]) -> ColumnElement[bool]:
        wanted = list(node_ids)
        if len(wanted) == 1:
            return NODE_STATES.c.node_id == wanted[0]
        return NODE_STATES.c.node_id.in_(wanted)

    def create_execution(
        self,
        execution: ExecutionRecord,
        *,
        names: tuple[str, str] | None,
        trigger: str,
        now: datetime,
        idempotency_key: str | None = None,
        dedupe_key: str | None = None,
        waiting_on: Mapping[str, int] | None = None,
        queued: Collection[str] = (),
        jobs: Sequence[NewJob] = (),
        start_job: uuid.UUID | None = None,
    ) -> Created:
        """See :class:`~conveyor.engine.ports.Executions`."""
        if names is not None and not self._latest(execution, names):
            return Created.STALE  # (a tenant that does not exist is not made, nor refused)
        try:
            self.add_execution(
                tenant_id=execution.tenant_id, workflow_id=execution.workflow_id,
                input=execution.input, priority=execution.priority, trigger=trigger,
                now=now, idempotency_key=idempotency_key, dedupe_key=dedupe_key,
                planned_nodes=len(waiting_on) if waiting_on is not None else None,
                execution_id=execution.id, trace=execution.trace,
                scheduled_for=execution.scheduled_for, limits=execution.limits,
                parent=execution.parent, depth=execution.depth,
            )  # fmt: skip
        except DuplicateExecution:
            return Created.KEY_TAKEN
        if waiting_on is not None:
            self.add_node_states(execution.id, waiting_on, queued)
        if jobs:
            self.add_node_jobs(execution, jobs, now)
        if start_job is not None:
            start = start_job_row(execution, start_job, now)
            self._core(insert(JOBS).values({**start, "execution_id": execution.id}))
        return Created.CREATED

    def _latest(self, execution: ExecutionRecord, names: tuple[str, str]) -> bool:
        """Whether ``names`` (tenant, workflow) name the execution's version as the latest."""
        return self._stored_target(*names) == (execution.tenant_id, execution.workflow_id)

    def add_node_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> None:
        rows = [node_job_row(execution, j, now) for j in jobs]
        self._core(insert(JOBS), [{**r, "execution_id": execution.id} for r in rows])

    def claim_node_job(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        """See :class:`~conveyor.engine.ports.Jobs`."""
        job = self.claim_job(job_id, JobKind.NODE, now)
        if job is None or job.node_id is None:
            return None
        execution = self.execution(job.execution_id, input=input)
        if execution.status.finished:
            return job, execution, None
        self.add_attempt(job, worker, now)
        if job.item_index is None:  # a map's item leaves its node (the map's counter) alone
            self.start_node(execution.id, job.node_id, now)
        if not needs:
            return job, execution, None
        rows = self.node_rows(execution.id, needs)
        return job, execution, {need: row.output for need, row in rows.items()}

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
        """See :class:`~conveyor.engine.ports.Jobs`."""
        if successors and not self._none_made_ready(job.execution_id, successors):
            return False
        completed = self._core(
            update(JOBS)
            .where(
                JOBS.c.id == job.id,
                JOBS.c.status == JobStatus.PROCESSING,
                *current_try(job.try_number),
                execution_runs(job.execution_id),
            )
            .values(status=JobStatus.COMPLETED, completed_at=now, last_error=None)
        )
        if not completed.rowcount:
            return False
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
        found = self._core(
            select(NODE_STATES.c.waiting_on, NODE_STATES.c.status).where(
                NODE_STATES.c.execution_id == execution_id, self._nodes_among(successors)
            )
        ).all()
        return all(r.waiting_on > 1 and r.status is NodeStatus.PENDING for r in found)
