"""The SQL of a map node's items (part of :class:`~conveyor.store.sql_store.SqlStore`; see
:mod:`conveyor.engine.mapping`): item jobs inserted, completed with their outputs, counted
down on the node's state, released from held one by one (each by the id the settled item's
job names, in ``jobs.data``), and read back in order."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Text, bindparam, case, cast, func, insert, select, update

from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import (
    ERROR_SLOT,
    FAILED_ITEM,
    ExecutionRecord,
    ItemRow,
    ItemsLeft,
    JobRecord,
    NewItem,
)
from conveyor.engine.states import (
    AttemptStatus,
    JobKind,
    JobStatus,
    NodeStatus,
)
from conveyor.models import Job
from conveyor.models.base import JsonType
from conveyor.store.jobs import (
    JobQueries,
    cancel_unstarted_jobs,
    current_try,
    execution_runs,
)
from conveyor.store.session import ATTEMPTS, JOBS, NODE_STATES, unindexed


class MapItemQueries(JobQueries):
    """A map's items (part of :class:`~conveyor.store.sql_store.SqlStore`)."""

    def add_item_jobs(
        self,
        execution: ExecutionRecord,
        node_id: str,
        items: Sequence[NewItem],
        max_retries: int,
        now: datetime,
    ) -> None:
        """One INSERT of the chunk (executemany: batched into few statements)."""
        if not items:
            return
        rows = [item_job_row(execution, node_id, i, max_retries, now) for i in items]
        self._core(insert(JOBS), rows)

    def open_map(self, execution_id: uuid.UUID, node_id: str, total: int) -> None:
        self._core(
            update(NODE_STATES)
            .where(NODE_STATES.c.execution_id == execution_id, NODE_STATES.c.node_id == node_id)
            .values(items_total=total, items_left=total, items_failed=0)
        )

    def complete_item(self, job: JobRecord, output: Any, now: datetime, duration: float) -> bool:
        completed = self._core(
            update(JOBS)
            .where(
                JOBS.c.id == job.id,
                unindexed(JOBS.c.status) == JobStatus.PROCESSING,
                *current_try(job.try_number),
                execution_runs(job.execution_id),
            )
            .values(status=JobStatus.COMPLETED, completed_at=now, last_error=None, output=output)
        )
        if not completed.rowcount:
            return False
        self.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
        return True

    def complete_item_alone(
        self, job: JobRecord, node_id: str, output: Any, now: datetime, duration: float
    ) -> ItemsLeft | None:
        """The counter read first, then :meth:`complete_item` and :meth:`settle_item`: on
        SQLite one transaction, whose write lock is taken at its start (PostgreSQL: one
        statement, :data:`~conveyor.store.postgres_statements.COMPLETE_ITEM`)."""
        node = self._core(
            select(NODE_STATES.c.items_left, NODE_STATES.c.status).where(
                NODE_STATES.c.execution_id == job.execution_id, NODE_STATES.c.node_id == node_id
            )
        ).one_or_none()
        if node is None or node.status is not NodeStatus.RUNNING or (node.items_left or 0) <= 1:
            return None
        if not self.complete_item(job, output, now, duration):
            return None
        return self.settle_item(job, node_id, False, now)

    def settle_item(
        self, job: JobRecord, node_id: str, failed: bool, now: datetime
    ) -> ItemsLeft | None:
        """Three statements: the counter (which takes the node state's row lock, so that two
        items settling at once take turns), the item the settled one names, then its release,
        by key (a held item found by its status and order instead reads every held row of
        every map when the statistics were taken with none held). The release skips a row
        another transaction has locked: only a cancel of the execution does (it cancels it)."""
        execution_id = job.execution_id
        counted = self._core(
            update(NODE_STATES)
            .where(
                NODE_STATES.c.execution_id == execution_id,
                NODE_STATES.c.node_id == node_id,
                NODE_STATES.c.status == NodeStatus.RUNNING,
                NODE_STATES.c.items_left > 0,
            )
            .values(
                items_left=NODE_STATES.c.items_left - 1,
                items_failed=NODE_STATES.c.items_failed + (1 if failed else 0),
            )
            .returning(NODE_STATES.c.items_left, NODE_STATES.c.items_failed)
        ).one_or_none()
        if counted is None:
            return None
        data = self._core(select(JOBS.c.data).where(JOBS.c.id == job.id)).scalar()
        released: list[JobRecord] = []
        if data and data.get("releases") is not None:
            named = select(Job.id).where(
                Job.execution_id == job.execution_id,
                Job.node_id == node_id,
                Job.item_index == int(data["releases"]),
            )
            still = unindexed(JOBS.c.status) == JobStatus.HELD
            released = self._take(named, still, status=JobStatus.QUEUED, enqueued_at=now)
        return ItemsLeft(
            left=counted.items_left,
            failed=counted.items_failed,
            released=released[0] if released else None,
        )

    def map_runs(self, execution_id: uuid.UUID, node_id: str) -> bool:
        """FOR SHARE (PostgreSQL): close_map's UPDATE of the row waits for this transaction,
        or this read for close_map's, and then sees the row it left."""
        status = self._core(
            select(NODE_STATES.c.status)
            .where(NODE_STATES.c.execution_id == execution_id, NODE_STATES.c.node_id == node_id)
            .with_for_update(read=True)
        ).scalar()
        return status is NodeStatus.RUNNING

    def close_map(
        self, execution_id: uuid.UUID, node_id: str, now: datetime, error: str
    ) -> list[uuid.UUID] | None:
        closed = self._core(
            update(NODE_STATES)
            .where(
                NODE_STATES.c.execution_id == execution_id,
                NODE_STATES.c.node_id == node_id,
                NODE_STATES.c.status == NodeStatus.RUNNING,
                NODE_STATES.c.items_total.is_not(None),
            )
            .values(status=NodeStatus.FAILED, error=error, finished_at=now)
        )
        if not closed.rowcount:
            return None
        return cancel_unstarted_jobs(
            self, [JOBS.c.execution_id == execution_id, JOBS.c.node_id == node_id], now
        )

    def item_outputs(self, execution_id: uuid.UUID, node_id: str) -> list[ItemRow]:
        total = (
            select(NODE_STATES.c.items_total)
            .where(NODE_STATES.c.execution_id == execution_id, NODE_STATES.c.node_id == node_id)
            .scalar_subquery()
        )
        rows = self._core(
            select(JOBS.c.item_index, JOBS.c.status, JOBS.c.output, JOBS.c.last_error)
            .where(
                JOBS.c.execution_id == execution_id,
                JOBS.c.node_id == node_id,
                JOBS.c.item_index.is_not(None),
                JOBS.c.item_index < total,
            )
            .order_by(JOBS.c.item_index)
        )
        return [
            ItemRow(index=r.item_index, status=r.status, output=r.output, error=r.last_error)
            for r in rows
        ]

    def renew_items(
        self,
        execution: ExecutionRecord,
        node_id: str,
        items: Sequence[NewItem],
        max_retries: int,
        now: datetime,
    ) -> dict[int, uuid.UUID]:
        """Two statements a chunk: its indices' jobs found, then each changed by its id (one
        UPDATE, run for every row)."""
        if not items:
            return {}
        found = {
            r.item_index: r.id
            for r in self._core(
                select(JOBS.c.id, JOBS.c.item_index).where(
                    JOBS.c.execution_id == execution.id,
                    JOBS.c.node_id == node_id,
                    JOBS.c.item_index.between(items[0].index, items[-1].index),
                )
            )
        }
        rows = [
            {"job_id": found[i.index], "new_item": i.item, "new_data": i.data,
             "new_status": JobStatus.HELD if i.held else JobStatus.QUEUED}
            for i in items if i.index in found
        ]  # fmt: skip
        if not rows:
            return {}
        tried = (
            select(func.count())
            .where(ATTEMPTS.c.job_id == JOBS.c.id)
            .correlate(JOBS)
            .scalar_subquery()
        )
        self._core(
            update(JOBS)
            .where(JOBS.c.id == bindparam("job_id"))
            .values(
                status=bindparam("new_status"), item=bindparam("new_item", type_=JsonType),
                data=bindparam("new_data", type_=JsonType),
                output=None, last_error=None, completed_at=None, next_run_at=None,
                retry_count=0, tries_before=tried, max_retries=max_retries,
                priority=execution.priority, enqueued_at=now,
            ),
            rows,
        )  # fmt: skip
        return {i.index: found[i.index] for i in items if i.index in found}

    def retire_items(
        self, execution_id: uuid.UUID, node_id: str, total: int, now: datetime, error: str
    ) -> None:
        self._core(
            update(JOBS)
            .where(
                JOBS.c.execution_id == execution_id,
                JOBS.c.node_id == node_id,
                JOBS.c.item_index >= total,
            )
            .values(
                status=JobStatus.CANCELLED, completed_at=now, output=None, last_error=error
            )
        )  # fmt: skip

    def items_size(self, execution_id: uuid.UUID, node_id: str) -> int:
        """One sum over the map's items (its key's index; those of its list, as
        :meth:`item_outputs` reads them), each output's JSON text made by the database; a
        worker reads none of them."""
        total = (
            select(NODE_STATES.c.items_total)
            .where(NODE_STATES.c.execution_id == execution_id, NODE_STATES.c.node_id == node_id)
            .scalar_subquery()
        )
        failed = JOBS.c.status.in_(FAILED_ITEM)
        slot = case(
            (failed, len(ERROR_SLOT) + func.coalesce(func.length(JOBS.c.last_error), 0)),
            else_=func.coalesce(func.length(cast(JOBS.c.output, Text)), len("null")),
        )
        found = self._core(
            select(func.coalesce(func.sum(slot + len(", ")), 0)).where(
                JOBS.c.execution_id == execution_id,
                JOBS.c.node_id == node_id,
                JOBS.c.item_index.is_not(None),
                JOBS.c.item_index < total,
            )
        ).scalar()
        return int(found or 0)


def item_job_row(
    execution: ExecutionRecord, node_id: str, item: NewItem, max_retries: int, now: datetime
) -> dict[str, Any]:
    return {
        "id": item.id, "kind": JobKind.NODE, "queue": NODE_QUEUE, "data": item.data,
        "status": JobStatus.HELD if item.held else JobStatus.QUEUED,
        "priority": execution.priority, "max_retries": max_retries, "retry_count": 0,
        "tries_before": 0, "tenant_id": execution.tenant_id,
        "workflow_id": execution.workflow_id, "execution_id": execution.id, "node_id": node_id,
        "next_run_at": None, "created_at": now, "enqueued_at": now, "item_index": item.index,
        "item": item.item,
    }  # fmt: skip
