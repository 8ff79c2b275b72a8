"""The SQL of dead letters: finding them, and the guarded steps of a requeue or a discard
(part of :class:`SqlStore`)."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import and_, case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from conveyor.engine.records import JobRecord
from conveyor.engine.states import ExecutionStatus, JobKind, JobStatus, NodeStatus
from conveyor.exceptions import DuplicateExecution
from conveyor.models import Execution, Job, JobAttempt, Tenant, WorkflowVersion
from conveyor.models.tables import NodeState
from conveyor.store.rows import job_record
from conveyor.store.session import JOBS, unindexed


@dataclass(frozen=True, kw_only=True)
class DeadLetterFilter:
    """Which dead letters to list; every field narrows, None does not."""

    tenant_id: uuid.UUID | None = None
    workflow: str | None = None
    node: str | None = None
    error: str | None = None  # a piece of the last error, any case
    before: datetime | None = None  # dead-lettered before this (older than)
    discarded: bool = False  # the archive of discarded ones instead


class DeadLetterRow(NamedTuple):
    """A dead letter as listed, with its links: ``job.item_index`` for a map's item."""

    job: Job
    workflow: str
    tenant: str
    # The child execution the job's last try started (a workflow node's, or a map of
    # children's item's): the failure the dead letter records is that child's.
    child_id: uuid.UUID | None
    # The parent execution, when the dead letter is in a child (whose dead letters are not
    # requeued: rerun the parent from its workflow node).
    parent_id: uuid.UUID | None


_CHILD = aliased(Execution)
_OWN = aliased(Execution)
_DEAD_LETTERS = (
    select(Job, WorkflowVersion.name, Tenant.name, _CHILD.id, _OWN.parent_execution_id)
    .join(WorkflowVersion, WorkflowVersion.id == Job.workflow_id)
    .join(Tenant, Tenant.id == Job.tenant_id)
    .join(_OWN, _OWN.id == Job.execution_id)
    .outerjoin(
        _CHILD,
        and_(
            _CHILD.parent_job_id == Job.id,
            _CHILD.parent_try == Job.tries_before + Job.retry_count + 1,
        ),
    )
)


class DeadLetterQueries:
    session: Session

    def dead_letter_rows(self, where: DeadLetterFilter, limit: int) -> list[DeadLetterRow]:
        """The dead letters the filter finds, the most recent first."""
        status = JobStatus.DISCARDED if where.discarded else JobStatus.DEAD_LETTER
        query = (
            _DEAD_LETTERS.where(Job.status == status)
            .order_by(Job.completed_at.desc(), Job.id)
            .limit(limit)
        )
        if where.tenant_id is not None:
            query = query.where(Job.tenant_id == where.tenant_id)
        if where.workflow is not None:
            query = query.where(WorkflowVersion.name == where.workflow)
        if where.node is not None:
            query = query.where(Job.node_id == where.node)
        if where.error is not None:
            query = query.where(Job.last_error.ilike(f"%{_escaped(where.error)}%", escape="\\"))
        if where.before is not None:
            query = query.where(Job.completed_at < where.before)
        return [DeadLetterRow(*r) for r in self.session.execute(query)]

    def dead_letter_history(
        self, job_id: uuid.UUID
    ) -> list[tuple[DeadLetterRow, list[JobAttempt]]]:
        """The dead letter as listed, and every attempt, oldest first."""
        row = self.session.execute(_DEAD_LETTERS.where(Job.id == job_id)).one_or_none()
        if row is None:
            return []
        attempts = self.session.scalars(
            select(JobAttempt)
            .where(JobAttempt.job_id == job_id)
            .order_by(JobAttempt.attempt_number)
        )
        return [(DeadLetterRow(*row), list(attempts))]

    def dead_letter(self, job_id: uuid.UUID, tenant_id: uuid.UUID | None) -> JobRecord | None:
        """A dead-lettered (or discarded) node job, locked; None if there is none (of that
        tenant)."""
        query = select(Job).where(
            Job.id == job_id,
            Job.kind == JobKind.NODE,
            unindexed(JOBS.c.status).in_([JobStatus.DEAD_LETTER, JobStatus.DISCARDED]),
        )
        if tenant_id is not None:
            query = query.where(Job.tenant_id == tenant_id)
        row = self.session.scalar(query.with_for_update())
        return job_record(row) if row else None

    def revive_execution(
        self,
        execution_id: uuid.UUID,
        finished: Collection[ExecutionStatus] = (ExecutionStatus.FAILED,),
    ) -> bool:
        """failed (or another of ``finished``: a rerun's) -> running, for a requeue; False if
        it is none of them. Its deduplication key active on another execution now breaks
        the index of active keys: :class:`DuplicateExecution`."""
        try:
            result = self.session.execute(
                update(Execution)
                .where(Execution.id == execution_id, Execution.status.in_(list(finished)))
                .values(status=ExecutionStatus.RUNNING, error=None, finished_at=None, output=None)
            )
        except IntegrityError as exc:
            raise DuplicateExecution(
                f"execution {execution_id}: its deduplication key is active on another execution"
            ) from exc
        return bool(result.rowcount)  # type: ignore[attr-defined]

    def revive_jobs(
        self, execution_id: uuid.UUID, now: datetime, keep: Collection[str]
    ) -> list[JobRecord]:
        """Give the node jobs the failure stopped (the dead letter, and the jobs cancelled
        with it) a fresh set of tries, but not those of the nodes in ``keep`` (failed and
        already settled): queued, or scheduled again if they were waiting for a time still
        to come (a delay). Their tries so far stay in ``job_attempts``, numbered on."""
        tried = (
            select(func.count()).where(JobAttempt.job_id == Job.id).correlate(Job).scalar_subquery()
        )
        later = Job.next_run_at.is_not(None) & (Job.next_run_at > now)
        rows = self.session.scalars(
            update(Job)
            .where(
                Job.execution_id == execution_id,
                Job.kind == JobKind.NODE,
                Job.status.in_([JobStatus.DEAD_LETTER, JobStatus.CANCELLED]),
                Job.node_id.not_in(list(keep)),
                Job.item_index.is_(None),  # a map's items: a requeue does not resume a map
            )
            .values(
                status=case((later, JobStatus.SCHEDULED), else_=JobStatus.QUEUED),
                tries_before=tried,
                retry_count=0,
                next_run_at=case((later, Job.next_run_at), else_=None),
                completed_at=None,
                enqueued_at=now,
            )
            .returning(Job),
            execution_options={"synchronize_session": False},
        ).all()
        return [job_record(r) for r in rows]

    def revive_nodes(
        self, execution_id: uuid.UUID, queued: Collection[str], keep: Collection[str]
    ) -> None:
        """Nodes whose job was revived wait for it; the other stopped ones (but those in
        ``keep``) wait for their needs again."""
        stopped = (NodeStatus.FAILED, NodeStatus.CANCELLED)
        base = update(NodeState).where(
            NodeState.execution_id == execution_id,
            NodeState.status.in_(stopped),
            NodeState.node_id.not_in(list(keep)),
        )
        cleared = {"error": None, "finished_at": None, "output": None, "branch": None}
        self.session.execute(
            base.where(NodeState.node_id.in_(list(queued))).values(
                status=NodeStatus.QUEUED, **cleared
            )
        )
        self.session.execute(
            base.where(NodeState.node_id.not_in(list(queued))).values(
                status=NodeStatus.PENDING, **cleared
            )
        )

    def recount(self, execution_id: uuid.UUID, waiting_on: dict[str, int], remaining: int) -> None:
        """Set the counters a resumed execution goes on with."""
        for node_id, count in waiting_on.items():
            self.session.execute(
                update(NodeState)
                .where(NodeState.execution_id == execution_id, NodeState.node_id == node_id)
                .values(waiting_on=count)
            )
        self.session.execute(
            update(Execution).where(Execution.id == execution_id).values(remaining_nodes=remaining)
        )

    def has_discarded(self, execution_id: uuid.UUID) -> bool:
        return (
            self.session.scalar(
                select(Job.id)
                .where(Job.execution_id == execution_id, Job.status == JobStatus.DISCARDED)
                .limit(1)
            )
            is not None
        )

    def discard_dead_letter(self, job_id: uuid.UUID, now: datetime) -> bool:
        result = self.session.execute(
            update(Job)
            .where(Job.id == job_id, unindexed(JOBS.c.status) == JobStatus.DEAD_LETTER)
            .values(status=JobStatus.DISCARDED, completed_at=now)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
