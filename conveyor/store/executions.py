"""Executions and their node states (part of :class:`~conveyor.store.sql_store.SqlStore`): the
statements both databases run alike. A node's claim and success, and an execution's creation,
which each database runs its own way, are the adapters' (:mod:`conveyor.store.postgres`,
:mod:`conveyor.store.sqlite`). The store never commits: the caller owns the unit of work.

Every state change of a job or an execution is a guarded UPDATE that only succeeds from the
expected status, so a message delivered twice, or two workers racing, change nothing twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    and_,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    not_,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from conveyor.engine.records import (
    ExecutionOutcome,
    ExecutionRecord,
    Finish,
    FollowUp,
    Limits,
    NodeRow,
    ParentLink,
    TraceContext,
)
from conveyor.engine.states import (
    ACTIVE_EXECUTION,
    FINISHED_EXECUTION,
    RUNNABLE_JOB,
    STOPPABLE_NODE,
    WAITING_JOB,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
    TriggerSource,
)
from conveyor.exceptions import DuplicateExecution, ExecutionNotFound, StoreError
from conveyor.ids import new_id
from conveyor.models import Execution, Job, NodeState, Tenant, WorkflowVersion
from conveyor.models.base import UTCDateTime
from conveyor.store.jobs import cancel_unstarted_jobs
from conveyor.store.rows import execution_record
from conveyor.store.session import EXECUTIONS, JOBS, NODE_STATES, StoreCore

_READINESS = (NODE_STATES.c.node_id, NODE_STATES.c.status, NODE_STATES.c.branch)


# A child still pending or running, as ix_executions_active_children holds it: the statuses
# literals, not parameters, so that a prepared statement's generic plan still proves the index.
ACTIVE_CHILD = and_(
    EXECUTIONS.c.parent_execution_id.is_not(None),
    EXECUTIONS.c.status.in_([literal_column("'pending'"), literal_column("'running'")]),
)


class ExecutionQueries(StoreCore):
    """Executions and node states (part of :class:`~conveyor.store.sql_store.SqlStore`)."""

    # -- executions -----------------------------------------------------------------------

    def add_execution(
        self,
        *,
        tenant_id: uuid.UUID,
        workflow_id: uuid.UUID,
        input: Any,
        priority: Priority,
        trigger: str,
        now: datetime,
        idempotency_key: str | None = None,
        dedupe_key: str | None = None,
        planned_nodes: int | None = None,
        execution_id: uuid.UUID | None = None,
        trace: TraceContext | None = None,
        scheduled_for: datetime | None = None,
        limits: Limits | None = None,
        parent: ParentLink | None = None,
        depth: int = 0,
    ) -> uuid.UUID:
        """Insert a pending execution (running, with ``planned_nodes`` unsettled, when it is
        planned in the same transaction); :class:`DuplicateExecution` if the tenant has one
        with this idempotency key (two retries racing: one inserts, the other finds it), or
        (a child) its parent's job has a child for this try already."""
        execution_id = execution_id or new_id()
        statement = insert(Execution).values(
            id=execution_id,
            tenant_id=tenant_id,
            workflow_id=workflow_id,
            status=ExecutionStatus.PENDING if planned_nodes is None else ExecutionStatus.RUNNING,
            priority=priority,
            trigger=trigger,
            input=input,
            remaining_nodes=planned_nodes or 0,
            started_at=None if planned_nodes is None else now,
            created_at=now,
            idempotency_key=idempotency_key,
            dedupe_key=dedupe_key,
            traceparent=trace.traceparent if trace else None,
            tracestate=trace.tracestate if trace else None,
            scheduled_for=scheduled_for,
            max_attempts=limits.max_attempts if limits else None,
            timeout=limits.timeout if limits else None,
            parent_execution_id=parent.execution_id if parent else None,
            parent_node_id=parent.node_id if parent else None,
            parent_job_id=parent.job_id if parent else None,
            parent_try=parent.try_number if parent else None,
            depth=depth,
        )
        if idempotency_key is None and dedupe_key is None and parent is None:
            self._core(statement)
            return execution_id
        try:
            with self.session.begin_nested():
                self.session.execute(statement)
        except IntegrityError as exc:
            raise DuplicateExecution("its idempotency or deduplication key is taken") from exc
        return execution_id

    def execution(self, execution_id: uuid.UUID, *, input: bool = True) -> ExecutionRecord:
        """With ``input`` False, the record's input is None: not read (nor parsed)."""
        columns = EXECUTIONS.c if input else _WITHOUT_INPUT
        row = self._core(select(*columns).where(EXECUTIONS.c.id == execution_id)).one_or_none()
        if row is None:
            raise ExecutionNotFound(
                f"no execution has id {execution_id}; list them with `conveyor executions list`"
            )
        return execution_record(row)

    def execution_status(
        self, execution_id: uuid.UUID, *, lock: bool = False
    ) -> ExecutionStatus | None:
        """The status; with ``lock``, read under the row lock (waits for a requeue that is
        changing it)."""
        query = _STATUS_LOCKED if lock else _STATUS
        found = self._core(query, {"execution_id": execution_id}).scalar()
        return cast(ExecutionStatus | None, found)

    def replace_unstarted_input(self, execution_id: uuid.UUID, input: Any) -> bool:
        """One statement, which locks the unclaimed start job (PostgreSQL): a claim racing it
        either went first (the job is claimed: nothing replaced) or waits for it, and then
        plans with the new input."""
        unclaimed = (
            select(Job.id)
            .where(
                Job.execution_id == execution_id,
                Job.kind == JobKind.EXECUTION,
                Job.status.in_([*RUNNABLE_JOB, *WAITING_JOB]),
            )
            .with_for_update()
            .exists()
        )
        result = self._core(
            update(EXECUTIONS)
            .where(
                EXECUTIONS.c.id == execution_id,
                EXECUTIONS.c.status == ExecutionStatus.PENDING,
                unclaimed,
            )
            .values(input=input)
        )
        return bool(result.rowcount)

    def leave_follow_up(self, execution_id: uuid.UUID, input: Any, now: datetime) -> bool:
        result = self._core(
            update(EXECUTIONS)
            .where(EXECUTIONS.c.id == execution_id, EXECUTIONS.c.status.in_(ACTIVE_EXECUTION))
            .values(follow_up=FollowUp.stored(input, now))
        )
        return bool(result.rowcount)

    def take_follow_up(self, execution_id: uuid.UUID) -> FollowUp | None:
        """Read under the row lock (the finishing transaction holds it already), then
        cleared: a trigger leaving a newer input waits for this transaction's end. FOR NO
        KEY UPDATE, as that update's own lock, not FOR UPDATE: it would wait for a stop's
        FOR KEY SHARE (:meth:`cancel_unstarted`) while that stop waits for this
        transaction's update of the row."""
        left = self.session.execute(
            select(
                Execution.follow_up,
                Execution.dedupe_key,
                Tenant.name,
                WorkflowVersion.name,
                Execution.priority,
                Execution.trigger,
            )
            .join(Tenant, Tenant.id == Execution.tenant_id)
            .join(WorkflowVersion, WorkflowVersion.id == Execution.workflow_id)
            .where(Execution.id == execution_id, Execution.follow_up.is_not(None))
            .with_for_update(of=Execution, key_share=True)
        ).one_or_none()
        if left is None:
            return None
        self._core(
            update(EXECUTIONS).where(EXECUTIONS.c.id == execution_id).values(follow_up=null())
        )
        if left[1] is None:
            return None
        return FollowUp(
            tenant=left[2], workflow=left[3], dedupe_key=left[1], input=left[0]["input"],
            priority=Priority(left[4]), source=TriggerSource(left[5]),
            left_at=FollowUp.left_at_of(left[0]),
        )  # fmt: skip

    def start_execution(self, execution_id: uuid.UUID, node_count: int, now: datetime) -> bool:
        result = self._core(
            update(EXECUTIONS)
            .where(EXECUTIONS.c.id == execution_id, EXECUTIONS.c.status == ExecutionStatus.PENDING)
            .values(status=ExecutionStatus.RUNNING, started_at=now, remaining_nodes=node_count)
        )
        return bool(result.rowcount)

    def settle_nodes(
        self, execution_id: uuid.UUID, count: int, finish: Finish | None = None
    ) -> int | None:
        """Count ``count`` more nodes as settled; the nodes still unsettled, or None if the
        execution is no longer running. With ``finish``, the execution completes in the same
        statement when none is left. Locks the execution row: call it last."""
        params: dict[str, Any] = {"execution_id": execution_id, "count": count}
        if finish is None:
            return cast(int | None, self._core(_SETTLE, params).scalar())
        params |= {"now": finish.now, "output": finish.output}
        return cast(int | None, self._core(_SETTLE_OR_FINISH, params).scalar())

    def finish_execution(
        self,
        execution_id: uuid.UUID,
        status: ExecutionStatus,
        now: datetime,
        *,
        output: Any = None,
        error: str | None = None,
    ) -> bool:
        result = self._core(
            update(EXECUTIONS)
            .where(EXECUTIONS.c.id == execution_id, EXECUTIONS.c.status.in_(ACTIVE_EXECUTION))
            .values(status=status, finished_at=now, output=output, error=error)
        )
        return bool(result.rowcount)

    def cancel_unstarted(self, execution_id: uuid.UUID, now: datetime) -> list[uuid.UUID]:
        """Cancel the jobs and nodes of an execution that have not started running (those
        waiting for a child too: the caller stops the children; and its map nodes whose items
        run: their items not started are cancelled); returns the cancelled node jobs the
        limiter may know.

        First the execution's row, FOR KEY SHARE (PostgreSQL): a transaction that read its
        status under the row's lock (FOR UPDATE: a map's items made, a child started) is then
        wholly before this one, its rows seen here, or after it, and sees the stop. It waits
        for no success (theirs is FOR NO KEY UPDATE, at their end), which hold rows this
        cancels before they want the execution's."""
        self._core(_HOLD_KEY, {"execution_id": execution_id})
        cancelled = cancel_unstarted_jobs(self, [JOBS.c.execution_id == execution_id], now)
        mapping = (NodeState.status == NodeStatus.RUNNING) & NodeState.items_total.is_not(None)
        self.session.execute(
            update(NodeState)
            .where(
                NodeState.execution_id == execution_id,
                NodeState.status.in_(STOPPABLE_NODE) | mapping,
            )
            .values(status=NodeStatus.CANCELLED, finished_at=now)
        )
        return cancelled

    # -- children -------------------------------------------------------------------------

    def execution_outcome(self, execution_id: uuid.UUID) -> ExecutionOutcome | None:
        row = self._core(
            select(
                EXECUTIONS.c.status, EXECUTIONS.c.output, EXECUTIONS.c.error,
                EXECUTIONS.c.created_at,
            ).where(EXECUTIONS.c.id == execution_id)
        ).one_or_none()  # fmt: skip
        if row is None:
            return None
        dead = self._core(
            select(JOBS.c.id, JOBS.c.node_id)
            .where(
                JOBS.c.execution_id == execution_id,
                JOBS.c.status.in_([JobStatus.DEAD_LETTER, JobStatus.DISCARDED]),
            )
            .order_by(JOBS.c.completed_at, JOBS.c.id)
            .limit(1)
        ).one_or_none()
        return ExecutionOutcome(
            status=row.status, output=row.output, error=row.error, created_at=row.created_at,
            dead_letter=(dead.id, dead.node_id) if dead is not None else None,
        )  # fmt: skip

    def children_started(self, execution_id: uuid.UUID, most: int) -> int:
        """At most ``most`` entries of the parent's index read."""
        started = (
            select(EXECUTIONS.c.id)
            .where(EXECUTIONS.c.parent_execution_id == execution_id)
            .limit(most)
            .subquery()
        )
        return int(self._core(select(func.count()).select_from(started)).scalar() or 0)

    def active_children(
        self, execution_id: uuid.UUID, node_id: str | None = None
    ) -> list[uuid.UUID]:
        found = select(EXECUTIONS.c.id).where(
            EXECUTIONS.c.parent_execution_id == execution_id,
            EXECUTIONS.c.status.in_(ACTIVE_EXECUTION),
        )
        if node_id is not None:
            found = found.where(EXECUTIONS.c.parent_node_id == node_id)
        return list(self.session.scalars(found.order_by(EXECUTIONS.c.created_at, EXECUTIONS.c.id)))

    def orphaned_children(self, limit: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
        """Found from the active children (ix_executions_active_children: few), each with its
        parent's job by its key."""
        waits = and_(
            JOBS.c.status == JobStatus.WAITING_CHILD,
            EXECUTIONS.c.parent_try == JOBS.c.tries_before + JOBS.c.retry_count + 1,
        )
        found = self._core(
            select(EXECUTIONS.c.id, EXECUTIONS.c.parent_execution_id)
            .outerjoin(JOBS, JOBS.c.id == EXECUTIONS.c.parent_job_id)
            .where(ACTIVE_CHILD, or_(JOBS.c.id.is_(None), not_(waits)))
            .order_by(EXECUTIONS.c.created_at, EXECUTIONS.c.id)
            .limit(limit)
            .with_for_update(of=EXECUTIONS, skip_locked=True)
        )
        return [(row.id, row.parent_execution_id) for row in found]

    def children_to_settle(self, limit: int) -> list[uuid.UUID]:
        """Found from the jobs waiting (few), each child by its parent's key."""
        return list(
            self.session.scalars(
                select(EXECUTIONS.c.id)
                .join(JOBS, JOBS.c.id == EXECUTIONS.c.parent_job_id)
                .where(
                    JOBS.c.status == JobStatus.WAITING_CHILD,
                    EXECUTIONS.c.parent_try == JOBS.c.tries_before + JOBS.c.retry_count + 1,
                    EXECUTIONS.c.status.in_(FINISHED_EXECUTION),
                )
                .order_by(EXECUTIONS.c.finished_at, EXECUTIONS.c.id)
                .limit(limit)
            )
        )

    # -- node states ----------------------------------------------------------------------

    def add_node_states(
        self,
        execution_id: uuid.UUID,
        waiting_on: Mapping[str, int],
        queued: Collection[str] = (),
    ) -> None:
        """A state row per node: pending, or queued for those in ``queued``."""
        self._core(
            insert(NODE_STATES),
            [
                {
                    "execution_id": execution_id,
                    "node_id": node_id,
                    "status": NodeStatus.QUEUED if node_id in queued else NodeStatus.PENDING,
                    "waiting_on": count,
                }
                for node_id, count in waiting_on.items()
            ],
        )

    def set_node(
        self,
        execution_id: uuid.UUID,
        node_id: str,
        status: NodeStatus,
        **values: Any,
    ) -> None:
        """Set a node's status (and other columns)."""
        self._core(
            update(NODE_STATES)
            .where(NODE_STATES.c.execution_id == execution_id, NODE_STATES.c.node_id == node_id)
            .values(status=status, **values)
        )

    def start_node(self, execution_id: uuid.UUID, node_id: str, now: datetime) -> None:
        self._core(
            update(NODE_STATES)
            .where(NODE_STATES.c.execution_id == execution_id, NODE_STATES.c.node_id == node_id)
            .values(
                status=NodeStatus.RUNNING,
                started_at=func.coalesce(NODE_STATES.c.started_at, now),
            )
        )

    def decrement_waiting(self, execution_id: uuid.UUID, node_ids: Sequence[str]) -> dict[str, int]:
        """One more need of each of ``node_ids`` settled; how many each still waits on.

        The row locks this takes are what make a join start exactly once when its
        predecessors finish at the same instant. Several rows are locked first in the order
        given (callers sort), so that two settles touching the same rows cannot deadlock."""
        where = (NODE_STATES.c.execution_id == execution_id) & self._nodes_among(node_ids)
        if len(node_ids) > 1:
            self._core(
                select(NODE_STATES.c.id)
                .where(where)
                .order_by(NODE_STATES.c.node_id)
                .with_for_update()
            ).all()
        rows = self._core(
            update(NODE_STATES)
            .where(where)
            .values(waiting_on=NODE_STATES.c.waiting_on - 1)
            .returning(NODE_STATES.c.node_id, NODE_STATES.c.waiting_on)
        ).all()
        left = {r.node_id: int(r.waiting_on) for r in rows}
        if missing := set(node_ids) - set(left):
            raise StoreError(f"nodes {sorted(missing)} have no state in execution {execution_id}")
        return left

    def queue_nodes(self, execution_id: uuid.UUID, node_ids: Sequence[str]) -> None:
        """pending -> queued, for nodes whose jobs were just added."""
        self._core(
            update(NODE_STATES)
            .where(
                NODE_STATES.c.execution_id == execution_id,
                self._nodes_among(node_ids),
                NODE_STATES.c.status == NodeStatus.PENDING,
            )
            .values(status=NodeStatus.QUEUED)
        )

    def node_rows(
        self, execution_id: uuid.UUID, node_ids: Iterable[str], *, outputs: bool = True
    ) -> dict[str, NodeRow]:
        """The states of some nodes of an execution; without ``outputs``, only their status
        and branch (a wide join's readiness reads no outputs)."""
        wanted = list(node_ids)
        if not wanted:
            return {}
        columns = NODE_STATES.c if outputs else _READINESS
        rows = self._core(
            select(*columns).where(
                NODE_STATES.c.execution_id == execution_id, self._nodes_among(wanted)
            )
        )
        if not outputs:
            return {
                r.node_id: NodeRow(node_id=r.node_id, status=r.status, branch=r.branch)
                for r in rows
            }
        return {
            r.node_id: NodeRow(
                node_id=r.node_id,
                status=r.status,
                branch=r.branch,
                output=r.output,
                error=r.error,
                items_total=r.items_total,
            )
            for r in rows
        }


# Statements of the hot path built once (their construction cost more than their execution).
_SETTLE = (
    update(EXECUTIONS)
    .where(
        EXECUTIONS.c.id == bindparam("execution_id"),
        EXECUTIONS.c.status == ExecutionStatus.RUNNING,
    )
    .values(remaining_nodes=EXECUTIONS.c.remaining_nodes - bindparam("count"))
    .returning(EXECUTIONS.c.remaining_nodes)
)
_LAST = EXECUTIONS.c.remaining_nodes == bindparam("count")  # in SET: the row's old value
_SETTLE_OR_FINISH = _SETTLE.values(
    status=case((_LAST, ExecutionStatus.COMPLETED), else_=EXECUTIONS.c.status),
    finished_at=case(
        (_LAST, bindparam("now", type_=UTCDateTime())), else_=EXECUTIONS.c.finished_at
    ),
    output=case(
        (_LAST, bindparam("output", type_=EXECUTIONS.c.output.type)), else_=EXECUTIONS.c.output
    ),
)
_STATUS = select(EXECUTIONS.c.status).where(EXECUTIONS.c.id == bindparam("execution_id"))
_STATUS_LOCKED = _STATUS.with_for_update()
_HOLD_KEY = (
    select(EXECUTIONS.c.id)
    .where(EXECUTIONS.c.id == bindparam("execution_id"))
    .with_for_update(read=True, key_share=True)
)
# An execution's columns with its input left out (None): a map's item that does not read it.
_WITHOUT_INPUT = [
    *(c for c in EXECUTIONS.c if c.name != "input"),
    null().label("input"),
]
