"""Reads for people: executions listed and shown whole, with their nodes, jobs and tries, as
the API and the CLI show them (part of :class:`~conveyor.store.sql_store.SqlStore`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from conveyor.engine.states import ExecutionStatus
from conveyor.exceptions import ExecutionNotFound
from conveyor.models import Execution, Job, JobAttempt, NodeState, WorkflowVersion


class ListingQueries:
    session: Session

    def list_executions(
        self, tenant_id: uuid.UUID | None, *, status: ExecutionStatus | None, limit: int
    ) -> Sequence[tuple[Execution, str, int]]:
        query = (
            select(Execution, WorkflowVersion.name, WorkflowVersion.version)
            .join(WorkflowVersion, WorkflowVersion.id == Execution.workflow_id)
            .order_by(Execution.created_at.desc())
            .limit(limit)
        )
        if tenant_id is not None:
            query = query.where(Execution.tenant_id == tenant_id)
        if status is not None:
            query = query.where(Execution.status == status)
        return [(e, n, v) for e, n, v in self.session.execute(query)]

    def execution_row(self, execution_id: uuid.UUID) -> Execution:
        row = self.session.get(Execution, execution_id)
        if row is None:
            raise ExecutionNotFound(
                f"no execution has id {execution_id}; list them with `conveyor executions list`"
            )
        return row

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

    def execution_nodes(self, execution_id: uuid.UUID) -> list[NodeState]:
        return list(
            self.session.scalars(
                select(NodeState)
                .where(NodeState.execution_id == execution_id)
                .order_by(NodeState.id)
            )
        )

    def execution_jobs(self, execution_id: uuid.UUID) -> list[tuple[Job, list[JobAttempt]]]:
        jobs = list(
            self.session.scalars(
                select(Job).where(Job.execution_id == execution_id).order_by(Job.created_at)
            )
        )
        attempts: dict[uuid.UUID, list[JobAttempt]] = {j.id: [] for j in jobs}
        for attempt in self.session.scalars(
            select(JobAttempt)
            .where(JobAttempt.job_id.in_(list(attempts)))
            .order_by(JobAttempt.attempt_number)
        ):
            attempts[attempt.job_id].append(attempt)
        return [(j, attempts[j.id]) for j in jobs]
