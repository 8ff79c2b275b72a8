"""The SQL of the recovery sweep and of running jobs' heartbeats (part of :class:`SqlStore`)."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, aliased

from conveyor.engine.records import JobRecord
from conveyor.engine.states import (
    ACTIVE_EXECUTION,
    FINISHED_EXECUTION,
    ExecutionStatus,
    JobKind,
    JobStatus,
)
from conveyor.models import Execution, Job, RecoveryCount, StreamListener, WorkflowVersion
from conveyor.store.rows import job_record
from conveyor.store.session import JOBS, unindexed, upsert
from conveyor.store.stats import add_to_tallies, tally_of


class RecoveryQueries:
    session: Session

    def heartbeat(self, job_ids: Collection[uuid.UUID], now: datetime) -> set[uuid.UUID]:
        """Renew running jobs' heartbeats; the ids renewed (a job missing was reclaimed, or
        has finished)."""
        if not job_ids:
            return set()
        return set(
            self.session.scalars(
                update(Job)
                .where(Job.id.in_(list(job_ids)), unindexed(JOBS.c.status) == JobStatus.PROCESSING)
                .values(heartbeat_at=now)
                .returning(Job.id),
                execution_options={"synchronize_session": False},
            )
        )

    def execution_statuses(
        self, execution_ids: Collection[uuid.UUID]
    ) -> dict[uuid.UUID, ExecutionStatus]:
        if not execution_ids:
            return {}
        rows = self.session.execute(
            select(Execution.id, Execution.status).where(Execution.id.in_(list(execution_ids)))
        )
        return {r.id: r.status for r in rows}

    def stale_processing(self, cutoff: datetime, limit: int) -> list[JobRecord]:
        """Node jobs processing whose heartbeat stopped before ``cutoff``, locked (skipping
        those another sweep holds)."""
        rows = self.session.scalars(
            select(Job)
            .where(
                Job.status == JobStatus.PROCESSING,
                Job.kind == JobKind.NODE,
                Job.heartbeat_at < cutoff,
            )
            .order_by(Job.heartbeat_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [job_record(r) for r in rows]

    def stale_queued(self, cutoff: datetime, limit: int) -> list[JobRecord]:
        """Jobs queued since before ``cutoff``: their message may be lost."""
        rows = self.session.execute(
            select(Job, WorkflowVersion.name)
            .join(WorkflowVersion, WorkflowVersion.id == Job.workflow_id)
            .where(Job.status == JobStatus.QUEUED, Job.enqueued_at < cutoff)
            .order_by(Job.enqueued_at)
            .limit(limit)
        )
        return [job_record(job, name) for job, name in rows]

    def claim_resend(
        self,
        job_ids: Collection[uuid.UUID],
        status: JobStatus,
        now: datetime,
        lapse_since: datetime,
    ) -> set[uuid.UUID]:
        """Claim the jobs whose message a sweep takes for lost, for one lapse: those still in
        ``status`` and not re-sent since ``lapse_since``. The ids claimed, to be re-sent by
        the caller. Any number of processes may claim the same jobs at once: the guarded
        UPDATE lets one of them have each job (a second waits for the first's row lock, then
        finds ``resent_at`` recent), so a lost message is re-sent once a lapse, not once per
        process per sweep."""
        if not job_ids:
            return set()
        return set(
            self.session.scalars(
                update(Job)
                .where(
                    Job.id.in_(list(job_ids)),
                    unindexed(JOBS.c.status) == status,
                    (Job.resent_at.is_(None)) | (Job.resent_at < lapse_since),
                )
                .values(resent_at=now)
                .returning(Job.id),
                execution_options={"synchronize_session": False},
            )
        )

    def active_by_dedupe(self, tenant_id: uuid.UUID, key: str) -> tuple[uuid.UUID, str] | None:
        """The pending or running execution with this deduplication key, and its workflow."""
        row = self.session.execute(
            select(Execution.id, WorkflowVersion.name)
            .join(WorkflowVersion, WorkflowVersion.id == Execution.workflow_id)
            .where(
                Execution.tenant_id == tenant_id,
                Execution.dedupe_key == key,
                Execution.status.in_(ACTIVE_EXECUTION),
            )
        ).one_or_none()
        return (row.id, row.name) if row else None

    def count_recovered(self, what: str, n: int) -> None:
        if n <= 0:
            return
        statement = upsert(self.session, RecoveryCount).values(what=what, count=n)
        self.session.execute(
            statement.on_conflict_do_update(
                index_elements=["what"], set_={"count": RecoveryCount.count + n}
            )
        )

    def recovery_counts(self) -> dict[str, int]:
        return {r.what: r.count for r in self.session.scalars(select(RecoveryCount))}

    # -- retention --------------------------------------------------------------------------

    def prune_finished(
        self, cutoff: datetime, limit: int, archive_cutoff: datetime | None = None
    ) -> int:
        """Delete up to ``limit`` executions finished before ``cutoff``, oldest first, with
        their jobs, tries and node states (foreign keys cascade); never one that holds a dead
        letter an operator may yet requeue, nor one discarded to the archive (kept for
        audit) unless it was discarded before ``archive_cutoff``, nor a child holding a dead
        letter while its parent is kept. How many were deleted.

        A dead letter waits for an operator only while a requeue can resume its execution:
        the execution failed, is no child (its parent's node went on), and the job is no
        map's item. The others (a map's dead items, a child's dead letters, those of an
        execution that completed or was cancelled) can only be discarded; they go with their
        execution, a child's with its parent, as every other row of theirs."""
        archived = Job.status == JobStatus.DISCARDED
        if archive_cutoff is not None:  # a discard sets completed_at
            archived &= Job.completed_at >= archive_cutoff
        dead = select(Job.id).where(
            Job.execution_id == Execution.id, Job.status == JobStatus.DEAD_LETTER
        )
        requeueable = dead.where(Job.item_index.is_(None)).exists() & (
            (Execution.status == ExecutionStatus.FAILED) & Execution.parent_execution_id.is_(None)
        )
        parent = aliased(Execution)
        kept_with_parent = (
            Execution.parent_execution_id.is_not(None)
            & dead.exists()
            & select(parent.id).where(parent.id == Execution.parent_execution_id).exists()
        )
        held = select(Job.id).where(Job.execution_id == Execution.id, archived).exists()
        doomed = list(
            self.session.scalars(
                select(Execution.id)
                .where(
                    Execution.finished_at < cutoff,
                    Execution.status.in_(list(FINISHED_EXECUTION)),
                    ~held,
                    ~requeueable,
                    ~kept_with_parent,
                )
                .order_by(Execution.finished_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        )
        if not doomed:
            return 0
        tallies = tally_of(self.session, doomed)
        self.session.execute(
            delete(Execution).where(Execution.id.in_(doomed)),
            execution_options={"synchronize_session": False},
        )
        # the registrations of live streams whose API process died without removing them
        self.session.execute(
            delete(StreamListener).where(StreamListener.created_at < cutoff),
            execution_options={"synchronize_session": False},
        )
        add_to_tallies(self.session, tallies)  # what was deleted stays counted
        return len(doomed)
