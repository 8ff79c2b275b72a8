"""All SQL lives in this package, one module a domain noun; this one holds executions, their
node states, and a node's claim and success, which touch all three tables at once. The store
never commits: the caller owns the unit of work.

Every state change of a job or an execution is a guarded UPDATE that only succeeds from the
expected status, so a message delivered twice, or two workers racing, change nothing twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Row,
    String,
    any_,
    bindparam,
    case,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from conveyor.engine.records import Created, ExecutionRecord, Finish, JobRecord, NewJob
from conveyor.engine.states import (
    WAITING_JOB,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
)
from conveyor.exceptions import DuplicateExecution, ExecutionNotFound, StoreError
from conveyor.ids import new_id
from conveyor.models import Execution, Job, NodeState
from conveyor.models.base import UTCDateTime
from conveyor.store import hot
from conveyor.store.access import AccessQueries
from conveyor.store.catalog import DEFAULT_TENANT, CatalogQueries
from conveyor.store.core import EXECUTIONS, JOBS, NODE_STATES
from conveyor.store.dead_letters import DeadLetterQueries
from conveyor.store.jobs import RUNNABLE, JobQueries, node_job_row, start_job_row
from conveyor.store.listing import ListingQueries
from conveyor.store.recovery import RecoveryQueries
from conveyor.store.rows import execution_record
from conveyor.store.schedules import ScheduleQueries
from conveyor.store.stats import StatsQueries

__all__ = ["DEFAULT_TENANT", "SqlStore"]

_ACTIVE_EXECUTION = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING)
_READINESS = (NODE_STATES.c.node_id, NODE_STATES.c.status, NODE_STATES.c.branch)


class SqlStore(
    CatalogQueries,
    JobQueries,
    ScheduleQueries,
    AccessQueries,
    DeadLetterQueries,
    StatsQueries,
    RecoveryQueries,
    ListingQueries,
):
    """The store port over one SQLAlchemy session (PostgreSQL or SQLite), its SQL in the
    modules it is made of (store.core says how statements run)."""

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
    ) -> uuid.UUID:
        """Insert a pending execution (running, with ``planned_nodes`` unsettled, when it is
        planned in the same transaction); :class:`DuplicateExecution` if the tenant has one
        with this idempotency key (two retries racing: one inserts, the other finds it)."""
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
        )
        if idempotency_key is None and dedupe_key is None:
            self._core(statement)
            return execution_id
        try:
            with self.session.begin_nested():
                self.session.execute(statement)
        except IntegrityError as exc:
            raise DuplicateExecution("its idempotency or deduplication key is taken") from exc
        return execution_id

    def create_execution(
        self,
        execution: ExecutionRecord,
        *,
        names: tuple[str, str],
        trigger: str,
        now: datetime,
        idempotency_key: str | None = None,
        dedupe_key: str | None = None,
        waiting_on: Mapping[str, int] | None = None,
        queued: Collection[str] = (),
        jobs: Sequence[NewJob] = (),
        start_job: uuid.UUID | None = None,
    ) -> Created:
        """Insert an execution as :meth:`add_execution` does, with, when it is planned at
        once (``waiting_on``: a state row per node), its node states and first jobs, or its
        start job (``start_job``): on PostgreSQL in one statement, so it needs no transaction
        of its own. ``names``: the tenant's and the workflow's, of which the execution's
        version must still be the latest. Nothing is inserted when it is not (STALE), or
        when the tenant has an execution with this idempotency key, or an active one with
        this deduplication key (KEY_TAKEN)."""
        planned = waiting_on is not None
        if not self._postgres:
            if self.trigger_target(*names) != (execution.tenant_id, execution.workflow_id):
                return Created.STALE
            try:
                self.add_execution(
                    tenant_id=execution.tenant_id, workflow_id=execution.workflow_id,
                    input=execution.input, priority=execution.priority, trigger=trigger,
                    now=now, idempotency_key=idempotency_key, dedupe_key=dedupe_key,
                    planned_nodes=len(waiting_on) if waiting_on is not None else None,
                    execution_id=execution.id,
                )  # fmt: skip
            except DuplicateExecution:
                return Created.KEY_TAKEN
            if waiting_on is not None:
                self.add_node_states(execution.id, waiting_on, queued)
            if jobs:
                self.add_node_jobs(execution, jobs, now)
            if start_job is not None:
                self._core(insert(JOBS).values(start_job_row(execution, start_job, now)))
            return Created.CREATED
        jobs_ = [node_job_row(execution, j, now) for j in jobs]
        if start_job is not None:
            jobs_.append(start_job_row(execution, start_job, now))
        states = list((waiting_on or {}).items())
        params = {
            "id": execution.id, "tenant_id": execution.tenant_id,
            "workflow_id": execution.workflow_id,
            "status": (ExecutionStatus.RUNNING if planned else ExecutionStatus.PENDING).value,
            "priority": execution.priority.value, "trigger": trigger, "input": execution.input,
            "remaining_nodes": len(states), "started_at": now if planned else None, "now": now,
            "idempotency_key": idempotency_key, "dedupe_key": dedupe_key,
            "state_nodes": [node_id for node_id, _ in states],
            "state_statuses": [
                (NodeStatus.QUEUED if node_id in queued else NodeStatus.PENDING).value
                for node_id, _ in states
            ],
            "state_waiting": [count for _, count in states],
            "job_ids": [j["id"] for j in jobs_],
            "job_kinds": [j["kind"].value for j in jobs_],
            "job_queues": [j["queue"] for j in jobs_],
            "job_statuses": [j["status"].value for j in jobs_],
            "job_nodes": [j["node_id"] for j in jobs_],
            "job_retries": [j["max_retries"] for j in jobs_],
            "job_next": [j["next_run_at"] for j in jobs_],
            "tenant_name": names[0], "workflow_name": names[1],
        }  # fmt: skip
        ((latest, made),) = self._hot(hot.CREATE_EXECUTION, params)
        if not latest:
            return Created.STALE
        return Created.CREATED if made else Created.KEY_TAKEN

    def execution(self, execution_id: uuid.UUID) -> ExecutionRecord:
        row = self._core(select(EXECUTIONS).where(EXECUTIONS.c.id == execution_id)).one_or_none()
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
            .where(EXECUTIONS.c.id == execution_id, EXECUTIONS.c.status.in_(_ACTIVE_EXECUTION))
            .values(status=status, finished_at=now, output=output, error=error)
        )
        return bool(result.rowcount)

    def cancel_unstarted(self, execution_id: uuid.UUID, now: datetime) -> list[uuid.UUID]:
        """Cancel the jobs and nodes of an execution that have not started running; returns
        the cancelled jobs that were queued or parked (the limiter may know them)."""
        cancelled = self.session.execute(
            update(Job)
            .where(
                Job.execution_id == execution_id,
                Job.status.in_([*RUNNABLE, *WAITING_JOB]),
            )
            .values(status=JobStatus.CANCELLED, completed_at=now)
            .returning(Job.id, Job.kind)
        ).all()
        self.session.execute(
            update(NodeState)
            .where(
                NodeState.execution_id == execution_id,
                NodeState.status.in_([NodeStatus.PENDING, NodeStatus.QUEUED]),
            )
            .values(status=NodeStatus.CANCELLED, finished_at=now)
        )
        return [job_id for job_id, kind in cancelled if kind is JobKind.NODE]

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

    def _nodes_among(self, node_ids: Iterable[str]) -> ColumnElement[bool]:
        """``node_id IN (...)``; on PostgreSQL ``node_id = ANY(array)``: one parameter, however
        many nodes (a fan-out's thousands as an IN list were a new statement text each time,
        which psycopg parses again: ~30 ms for 2,000). One node is ``node_id = :id``: the plan
        psycopg prepares for ``= ANY`` reads all the execution's rows and filters them by name
        (see the note above store.hot.CLAIM_NODE), a fan-out's thousands for each node."""
        wanted = list(node_ids)
        if len(wanted) == 1:
            return NODE_STATES.c.node_id == wanted[0]
        if self._postgres:
            ids = bindparam(None, wanted, type_=ARRAY(String()))
            return NODE_STATES.c.node_id == any_(ids)
        return NODE_STATES.c.node_id.in_(wanted)

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
    ) -> dict[str, Row[Any]]:
        """The state rows of some nodes of an execution (status, branch, output...); without
        ``outputs``, only their status and branch (a wide join's readiness reads no outputs)."""
        wanted = list(node_ids)
        if not wanted:
            return {}
        columns = NODE_STATES.c if outputs else _READINESS
        rows = self._core(
            select(*columns).where(
                NODE_STATES.c.execution_id == execution_id, self._nodes_among(wanted)
            )
        )
        return {r.node_id: r for r in rows}

    # -- a node's claim and success ------------------------------------------------------

    def claim_node_job(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        needs: Sequence[str] = (),
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        """Claim a node job (queued or parked -> processing) with its execution; unless the
        execution has finished, also start its try (an attempt row) and its node (running).
        None when the job is not a runnable node job. On PostgreSQL this is one statement,
        which also reads the outputs of ``needs`` (the nodes the job's node is expected to
        need): the third item, None when they were not read."""
        if self._postgres:
            params = {"id": job_id, "now": now, "worker": worker}
            # (no array parameter for none or one: planned once, see store.hot)
            if not needs:
                rows = self._hot(hot.CLAIM_NODE_ALONE, params)
            elif len(needs) == 1:
                rows = self._hot(hot.CLAIM_NODE_AFTER_ONE, params | {"need": needs[0]})
            else:
                rows = self._hot(hot.CLAIM_NODE, params | {"needs": list(needs)})
            if not rows:
                return None
            claimed, execution, outputs = hot.claimed(rows[0])
            return claimed, execution, (outputs if needs else None)
        job = self.claim_job(job_id, JobKind.NODE, now)
        if job is None or job.node_id is None:
            return None
        execution = self.execution(job.execution_id)
        if not execution.status.finished:
            self.add_attempt(job, worker, now)
            self.start_node(execution.id, job.node_id, now)
        return job, execution, None

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
        """Record a node's success in one statement, if the database can and the case is the
        common one: the job still processing, its execution still running. True when done
        (job completed, attempt succeeded, node completed with its output); False when the
        caller must take the general path (nothing was changed).

        With ``successors`` the statement is the node's whole success, when it makes none of
        them ready (False, nothing changed, when it would): each one need fewer, the node
        settled and, with ``finish`` (for a node nothing waits on), the execution completed
        if it was the last. Run alone, it commits without a lock held across round trips."""
        if not self._postgres:
            return False
        params = {
            "id": job.id, "execution_id": job.execution_id, "node_id": node_id,
            "attempt": job.try_number, "output": output, "branch": branch, "now": now,
            "duration": duration,
        }  # fmt: skip
        if successors is None:
            return bool(self._hot(hot.COMPLETE_NODE, params)[0][0])
        params |= {
            "finishes": finish is not None,
            "execution_output": finish.output if finish is not None else None,
        }
        # (no array parameter for none or one: planned once, see store.hot)
        if not successors:
            return bool(self._hot(hot.COMPLETE_LAST, params)[0][0])
        if len(successors) == 1:
            params["successor"] = successors[0]
            return bool(self._hot(hot.COMPLETE_BEFORE_ONE, params)[0][0])
        params["successors"] = list(successors)
        return bool(self._hot(hot.COMPLETE_ALONE, params)[0][0])


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
