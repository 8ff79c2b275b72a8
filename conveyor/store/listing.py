"""Reads for people: executions listed and shown whole, with their nodes, jobs and tries, as
the API and the CLI show them (part of :class:`~conveyor.store.sql_store.SqlStore`)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVarTuple

from sqlalchemy import Select, and_, exists, func, select, text, tuple_
from sqlalchemy.orm import Session

from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.exceptions import ExecutionNotFound
from conveyor.models import (
    Execution,
    Job,
    JobAttempt,
    NodeState,
    StreamEvent,
    WorkflowVersion,
)

Ts = TypeVarTuple("Ts")


@dataclass(frozen=True, kw_only=True)
class ExecutionFilter:
    """Which executions a listing or the status view counts; every field narrows it."""

    status: ExecutionStatus | None = None
    workflow: str | None = None  # a workflow's name: every version of it
    node_status: NodeStatus | None = None  # has at least one node in this status
    created_after: datetime | None = None  # strictly after
    created_before: datetime | None = None  # strictly before
    dedupe_key: str | None = None  # active or finished
    idempotency_key: str | None = None
    parent: uuid.UUID | None = None  # the children of this execution

    def applied(self, query: Select[*Ts]) -> Select[*Ts]:
        if self.status is not None:
            query = query.where(Execution.status == self.status)
        if self.workflow is not None:
            query = query.where(WorkflowVersion.name == self.workflow)
        if self.node_status is not None:
            query = query.where(
                exists().where(
                    NodeState.execution_id == Execution.id, NodeState.status == self.node_status
                )
            )
        if self.created_after is not None:
            query = query.where(Execution.created_at > self.created_after)
        if self.created_before is not None:
            query = query.where(Execution.created_at < self.created_before)
        if self.dedupe_key is not None:
            query = query.where(Execution.dedupe_key == self.dedupe_key)
        if self.idempotency_key is not None:
            query = query.where(Execution.idempotency_key == self.idempotency_key)
        if self.parent is not None:
            query = query.where(Execution.parent_execution_id == self.parent)
        return query


@dataclass(frozen=True, kw_only=True)
class StatusCount:
    """One line of the status view: a workflow's executions in one status."""

    workflow: str
    status: ExecutionStatus
    count: int
    oldest: datetime
    newest: datetime
    attempts: int  # tries of their jobs, all told


class ListingQueries:
    session: Session

    def list_executions(
        self,
        tenant_id: uuid.UUID | None,
        *,
        where: ExecutionFilter | None = None,
        after: uuid.UUID | None = None,
        limit: int,
    ) -> Sequence[tuple[Execution, str, int]]:
        """Newest first (by creation, then id). ``after``: the last execution of the previous
        page; the page goes on below it (keyset pagination: no row is skipped or repeated by
        executions created meanwhile)."""
        query = (
            select(Execution, WorkflowVersion.name, WorkflowVersion.version)
            .join(WorkflowVersion, WorkflowVersion.id == Execution.workflow_id)
            .order_by(Execution.created_at.desc(), Execution.id.desc())
            .limit(limit)
        )
        if tenant_id is not None:
            query = query.where(Execution.tenant_id == tenant_id)
        if where is not None:
            query = where.applied(query)
        if after is not None:
            mark = select(Execution.created_at).where(Execution.id == after)
            if tenant_id is not None:
                mark = mark.where(Execution.tenant_id == tenant_id)
            created = self.session.scalar(mark)
            if created is None:
                raise ExecutionNotFound(
                    f"no execution has id {after}: page on with the last id of a page listed"
                )
            query = query.where(tuple_(Execution.created_at, Execution.id) < (created, after))
        return [(e, n, v) for e, n, v in self.session.execute(query)]

    def status_counts(
        self, tenant_id: uuid.UUID | None, where: ExecutionFilter | None = None
    ) -> list[StatusCount]:
        """The status view: executions counted by workflow and status, with the oldest and
        newest creation and their jobs' tries (two grouped statements, no row fetched)."""
        base = select(WorkflowVersion.name, Execution.status).join(
            WorkflowVersion, WorkflowVersion.id == Execution.workflow_id
        )
        if tenant_id is not None:
            base = base.where(Execution.tenant_id == tenant_id)
        if where is not None:
            base = where.applied(base)
        groups = self.session.execute(
            base.add_columns(
                func.count(), func.min(Execution.created_at), func.max(Execution.created_at)
            ).group_by(WorkflowVersion.name, Execution.status)
        ).all()
        tries = dict(
            ((name, status), n)
            for name, status, n in self.session.execute(
                base.join(Job, Job.execution_id == Execution.id)
                .join(JobAttempt, JobAttempt.job_id == Job.id)
                .add_columns(func.count())
                .group_by(WorkflowVersion.name, Execution.status)
            )
        )
        return [
            StatusCount(
                workflow=name,
                status=status,
                count=count,
                oldest=oldest,
                newest=newest,
                attempts=tries.get((name, status), 0),
            )
            for name, status, count, oldest, newest in sorted(
                groups, key=lambda g: (g[0], g[1].value)
            )
        ]

    def execution_row(self, execution_id: uuid.UUID) -> Execution:
        row = self.session.get(Execution, execution_id)
        if row is None:
            raise ExecutionNotFound(
                f"no execution has id {execution_id}; list them with `conveyor executions list`"
            )
        return row

    def children_count(self, execution_id: uuid.UUID) -> int:
        """How many children the execution's workflow nodes started, in every try."""
        counted = select(func.count()).where(Execution.parent_execution_id == execution_id)
        return int(self.session.execute(counted).scalar_one())

    def workflow_of(self, execution_id: uuid.UUID) -> tuple[str, int] | None:
        """The name and version of the execution's workflow; None: no such execution."""
        row = self.session.execute(
            select(WorkflowVersion.name, WorkflowVersion.version)
            .join(Execution, Execution.workflow_id == WorkflowVersion.id)
            .where(Execution.id == execution_id)
        ).one_or_none()
        return (row.name, row.version) if row else None

    def live_state(self, execution_id: uuid.UUID) -> tuple[str, list[tuple[str, str]]]:
        """An execution's status and its nodes' (as made), in one statement and snapshot:
        what a live stream reads, and nothing more of the rows."""
        found = self.live_states([execution_id])
        if execution_id not in found:
            raise ExecutionNotFound(f"no execution has id {execution_id}")
        return found[execution_id]

    def live_states(
        self, execution_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[str, list[tuple[str, str]]]]:
        """:meth:`live_state` of each execution that exists, in one statement."""
        rows = self.session.execute(
            select(Execution.id, Execution.status, NodeState.node_id, NodeState.status)
            .outerjoin(NodeState, NodeState.execution_id == Execution.id)
            .where(Execution.id.in_(execution_ids))
            .order_by(Execution.id, NodeState.id)
        ).all()
        found: dict[uuid.UUID, tuple[str, list[tuple[str, str]]]] = {}
        for execution_id, status, node_id, node_status in rows:
            _, nodes = found.setdefault(execution_id, (status.value, []))
            if node_id is not None:
                nodes.append((node_id, node_status.value))
        return found

    # -- the tenant streams' events (conveyor.api.tenant_stream) --------------------------------

    def stream_horizon(self) -> tuple[int, int]:
        """The cursor below which every event that will ever be written can be read now: on
        PostgreSQL, (the oldest transaction id still running, 0); on SQLite, whose writers
        take turns, (0, the last id)."""
        if self.session.get_bind().dialect.name == "postgresql":
            oldest = self.session.execute(
                text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            ).scalar_one()
            return (int(oldest), 0)
        last = self.session.execute(select(func.max(StreamEvent.id))).scalar_one()
        return (0, int(last or 0))

    def stream_events(
        self,
        after: tuple[int, int],
        *,
        limit: int,
        tenant_id: uuid.UUID | None = None,
        workflow: str | None = None,
        dedupe_key: str | None = None,
    ) -> tuple[list[tuple[tuple[int, int], uuid.UUID, dict[str, object]]], tuple[int, int]]:
        """Up to ``limit`` events after the cursor ``after`` (those of one tenant, workflow or
        dedupe key if given), in order, each as (its cursor, its tenant, what a stream sends);
        and the cursor to read on from: past every event that matched or ever will, so far."""
        horizon = self.stream_horizon()  # first: what is below it is all visible below
        query = select(StreamEvent, WorkflowVersion.name, WorkflowVersion.version).join(
            WorkflowVersion, WorkflowVersion.id == StreamEvent.workflow_id
        )
        if horizon[1] == 0:  # PostgreSQL: in (txid, id) order, below the horizon
            query = query.where(
                tuple_(StreamEvent.txid, StreamEvent.id) > tuple_(*after),
                StreamEvent.txid < horizon[0],
            ).order_by(StreamEvent.txid, StreamEvent.id)
        else:
            query = query.where(StreamEvent.id > after[1]).order_by(StreamEvent.id)
        query = query.limit(limit)
        if tenant_id is not None:
            query = query.where(StreamEvent.tenant_id == tenant_id)
        if workflow is not None:
            query = query.where(WorkflowVersion.name == workflow)
        if dedupe_key is not None:
            query = query.where(StreamEvent.dedupe_key == dedupe_key)
        found = []
        for row, name, version in self.session.execute(query):
            data: dict[str, object] = {
                "execution_id": str(row.execution_id),
                "workflow": name,
                "version": version,
                "status": row.status,
                "dedupe_key": row.dedupe_key,
                "at": row.created_at.isoformat(),
            }
            found.append(((row.txid or 0, row.id), row.tenant_id, data))
        if len(found) == limit:  # more may follow the last
            return found, found[-1][0]
        return found, max([horizon, after, *(cursor for cursor, _, _ in found)])

    def execution_nodes(self, execution_id: uuid.UUID) -> list[NodeState]:
        return list(
            self.session.scalars(
                select(NodeState)
                .where(NodeState.execution_id == execution_id)
                .order_by(NodeState.id)
            )
        )

    def execution_jobs(self, execution_id: uuid.UUID) -> list[tuple[Job, list[JobAttempt]]]:
        """Its jobs with their tries, but a map's items (:meth:`item_counts` sums them up,
        :meth:`execution_items` lists them a page at a time)."""
        jobs = list(
            self.session.scalars(
                select(Job)
                .where(Job.execution_id == execution_id, Job.item_index.is_(None))
                .order_by(Job.created_at)
            )
        )
        return [(j, tries) for j, tries in zip(jobs, self._attempts(jobs), strict=True)]

    def _attempts(self, jobs: Sequence[Job]) -> list[list[JobAttempt]]:
        """Each job's tries, in order (one read)."""
        attempts: dict[uuid.UUID, list[JobAttempt]] = {j.id: [] for j in jobs}
        if not jobs:
            return []
        for attempt in self.session.scalars(
            select(JobAttempt)
            .where(JobAttempt.job_id.in_(list(attempts)))
            .order_by(JobAttempt.attempt_number)
        ):
            attempts[attempt.job_id].append(attempt)
        return [attempts[j.id] for j in jobs]

    def item_indices(self, job_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, int]:
        """Which of these jobs are a map's items (children's parent jobs), with their indices."""
        if not job_ids:
            return {}
        found = self.session.execute(
            select(Job.id, Job.item_index).where(
                Job.id.in_(list(job_ids)), Job.item_index.is_not(None)
            )
        )
        return {job_id: index for job_id, index in found if index is not None}

    def started_children(self, job_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
        """The child execution each of these jobs' current try started (a workflow node's,
        or a map of children's item's), by job."""
        if not job_ids:
            return {}
        found = self.session.execute(
            select(Execution.parent_job_id, Execution.id)
            .join(Job, Job.id == Execution.parent_job_id)
            .where(
                Execution.parent_job_id.in_(list(job_ids)),
                Execution.parent_try == Job.tries_before + Job.retry_count + 1,
            )
        )
        return {job_id: child for job_id, child in found if job_id is not None}

    def item_counts(self, execution_id: uuid.UUID) -> dict[str, dict[JobStatus, int]]:
        """Each map node's items counted by their jobs' status (one grouped read)."""
        counted: dict[str, dict[JobStatus, int]] = {}
        for node_id, status, count in self.session.execute(
            select(Job.node_id, Job.status, func.count())
            .join(*_ITS_MAP)
            .where(Job.execution_id == execution_id, *_IN_ITS_LIST)
            .group_by(Job.node_id, Job.status)
        ):
            counted.setdefault(node_id or "", {})[status] = count
        return counted

    def failed_items(self, execution_id: uuid.UUID, limit: int) -> list[Job]:
        """Up to ``limit`` dead (or discarded) items of the execution's maps, by node and
        index."""
        return list(
            self.session.scalars(
                select(Job)
                .join(*_ITS_MAP)
                .where(
                    Job.execution_id == execution_id,
                    *_IN_ITS_LIST,
                    Job.status.in_([JobStatus.DEAD_LETTER, JobStatus.DISCARDED]),
                )
                .order_by(Job.node_id, Job.item_index)
                .limit(limit)
            )
        )

    def execution_items(
        self,
        execution_id: uuid.UUID,
        node_id: str,
        *,
        after: int | None = None,
        limit: int,
        status: JobStatus | None = None,
    ) -> list[tuple[Job, list[JobAttempt]]]:
        """A page of a map node's items in index order, from after index ``after``, with
        their tries."""
        query = (
            select(Job)
            .join(*_ITS_MAP)
            .where(Job.execution_id == execution_id, Job.node_id == node_id, *_IN_ITS_LIST)
            .order_by(Job.item_index)
            .limit(limit)
        )
        if after is not None:
            query = query.where(Job.item_index > after)
        if status is not None:
            query = query.where(Job.status == status)
        jobs = list(self.session.scalars(query))
        return [(j, tries) for j, tries in zip(jobs, self._attempts(jobs), strict=True)]


# A map's items joined to their node's state: those of its list (an earlier run's past it, a
# re-run map's, are not; nor any before the list is rendered again).
_ITS_MAP = (
    NodeState,
    and_(NodeState.execution_id == Job.execution_id, NodeState.node_id == Job.node_id),
)
_IN_ITS_LIST = (Job.item_index.is_not(None), Job.item_index < NodeState.items_total)
