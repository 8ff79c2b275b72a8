"""The SQL of reruns (part of :class:`~conveyor.store.sql_store.SqlStore`): the record of who
re-ran an execution from which node, the held jobs of the nodes that run again, and the input a
rerun gave its node. None of it runs for an execution that was never re-run."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import and_, bindparam, func, insert, select, update
from sqlalchemy.orm import aliased

from conveyor.engine.records import ExecutionRecord, NewJob
from conveyor.engine.states import ACTIVE_EXECUTION, JobKind, JobStatus, NodeStatus
from conveyor.models import Execution, ExecutionRerun, Job, JobAttempt, NodeState
from conveyor.store.session import JOBS, StoreCore

# A job whose try is over: a rerun may hold it (one in flight is left alone).
_HOLDABLE = (
    JobStatus.COMPLETED,
    JobStatus.DEAD_LETTER,
    JobStatus.DISCARDED,
    JobStatus.CANCELLED,
    JobStatus.HELD,
)


class RerunQueries(StoreCore):
    """Reruns (part of :class:`~conveyor.store.sql_store.SqlStore`)."""

    def dedupe_holder(self, execution_id: uuid.UUID) -> uuid.UUID | None:
        other = aliased(Execution)
        return cast(
            uuid.UUID | None,
            self.session.scalar(
                select(other.id)
                .join(
                    Execution,
                    and_(
                        Execution.tenant_id == other.tenant_id,
                        Execution.dedupe_key == other.dedupe_key,
                    ),
                )
                .where(
                    Execution.id == execution_id,
                    other.id != execution_id,
                    other.status.in_(ACTIVE_EXECUTION),
                )
                .limit(1)
            ),
        )

    def add_rerun(
        self,
        execution_id: uuid.UUID,
        from_node: str,
        input: dict[str, Any] | None,
        requested_by: str,
        now: datetime,
    ) -> None:
        self.session.execute(
            insert(ExecutionRerun).values(
                execution_id=execution_id, from_node=from_node, input=input,
                requested_by=requested_by, requested_at=now,
            )
        )  # fmt: skip
        self.session.execute(
            update(Execution)
            .where(Execution.id == execution_id)
            .values(reruns=Execution.reruns + 1)
        )

    def rerun_input(self, execution_id: uuid.UUID, node_id: str) -> dict[str, Any] | None:
        latest = self.session.execute(
            select(ExecutionRerun.from_node, ExecutionRerun.input)
            .where(ExecutionRerun.execution_id == execution_id)
            .order_by(ExecutionRerun.id.desc())
            .limit(1)
        ).one_or_none()
        if latest is None or latest.from_node != node_id:
            return None
        return cast(dict[str, Any] | None, latest.input)

    def hold_jobs(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> None:
        tried = (
            select(func.count()).where(JobAttempt.job_id == Job.id).correlate(Job).scalar_subquery()
        )
        self.session.execute(
            update(Job)
            .where(
                Job.execution_id == execution_id,
                Job.kind == JobKind.NODE,
                Job.node_id.in_(list(node_ids)),
                Job.status.in_(_HOLDABLE),
            )
            .values(
                status=JobStatus.HELD,
                tries_before=tried,
                retry_count=0,
                next_run_at=None,
                completed_at=None,
                last_error=None,
                output=None,
            ),
            execution_options={"synchronize_session": False},
        )

    def items_in_flight(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> list[str]:
        found = self.session.scalars(
            select(Job.node_id)
            .where(
                Job.execution_id == execution_id,
                Job.node_id.in_(list(node_ids)),
                Job.item_index.is_not(None),
                Job.status.not_in(_HOLDABLE),
            )
            .distinct()
        )
        return sorted(n for n in found if n is not None)

    def reset_nodes(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> None:
        self.session.execute(
            update(NodeState)
            .where(NodeState.execution_id == execution_id, NodeState.node_id.in_(list(node_ids)))
            .values(
                status=NodeStatus.PENDING,
                output=None,
                branch=None,
                error=None,
                started_at=None,
                finished_at=None,
                items_total=None,
                items_left=None,
                items_failed=None,
            ),
            execution_options={"synchronize_session": False},
        )

    def take_held_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> dict[str, uuid.UUID]:
        """Two statements however many jobs: the held ones found (locked), then each changed
        by its id (one UPDATE, run for every row)."""
        wanted = {j.node_id: j for j in jobs}
        held = self.session.execute(
            select(Job.id, Job.node_id)
            .where(
                Job.execution_id == execution.id,
                Job.node_id.in_(list(wanted)),
                Job.status == JobStatus.HELD,
                Job.item_index.is_(None),  # a node's own job, never a map's held item
            )
            .with_for_update()
        ).all()
        if not held:
            return {}
        rows = [_taken(row.id, wanted[row.node_id]) for row in held]
        self._core(
            update(JOBS)
            .where(JOBS.c.id == bindparam("job_id"), JOBS.c.status == JobStatus.HELD)
            .values(
                status=bindparam("new_status"),
                next_run_at=bindparam("new_next"),
                max_retries=bindparam("new_retries"),
                priority=execution.priority,
                enqueued_at=now,
            ),
            rows,
        )
        return {row.node_id: row.id for row in held}

    def execution_reruns(self, execution_id: uuid.UUID) -> list[ExecutionRerun]:
        """Its reruns, oldest first (what ``executions show`` lists)."""
        return list(
            self.session.scalars(
                select(ExecutionRerun)
                .where(ExecutionRerun.execution_id == execution_id)
                .order_by(ExecutionRerun.id)
            )
        )


def _taken(job_id: uuid.UUID, new: NewJob) -> dict[str, Any]:
    """The values a held job takes from the new job it stands in for."""
    return {
        "job_id": job_id,
        "new_status": JobStatus.SCHEDULED if new.next_run_at else JobStatus.QUEUED,
        "new_next": new.next_run_at,
        "new_retries": new.max_retries,
    }
