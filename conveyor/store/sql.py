"""All SQL lives here. The store never commits: the caller owns the unit of work.

Every state change of a job or an execution is a guarded UPDATE that only succeeds from the
expected status, so a message delivered twice, or two workers racing, change nothing twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    CursorResult,
    Executable,
    Row,
    Select,
    String,
    Table,
    any_,
    bindparam,
    case,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from conveyor.engine.queues import EXECUTION_QUEUE, NODE_QUEUE
from conveyor.engine.records import (
    Admission,
    Created,
    ExecutionRecord,
    Finish,
    JobRecord,
    NewJob,
    WorkflowRecord,
)
from conveyor.engine.states import (
    WAITING_JOB,
    AttemptStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
)
from conveyor.exceptions import (
    DuplicateExecution,
    ExecutionNotFound,
    StoreError,
    TenantNotFound,
    WorkflowNotFound,
)
from conveyor.ids import new_id
from conveyor.models import Execution, Job, JobAttempt, NodeState, Tenant, WorkflowVersion
from conveyor.models.base import UTCDateTime
from conveyor.store import hot
from conveyor.store.access import AccessQueries
from conveyor.store.dead_letters import DeadLetterQueries
from conveyor.store.recovery import RecoveryQueries
from conveyor.store.rows import execution_record, job_record, workflow_record
from conveyor.store.schedules import ScheduleQueries
from conveyor.store.stats import StatsQueries

DEFAULT_TENANT = "default"
# The tables, for the Core statements of the hot path (see SqlStore._core).
JOBS = cast(Table, Job.__table__)
EXECUTIONS = cast(Table, Execution.__table__)
NODE_STATES = cast(Table, NodeState.__table__)
ATTEMPTS = cast(Table, JobAttempt.__table__)
WORKFLOWS = cast(Table, WorkflowVersion.__table__)
_ACTIVE_EXECUTION = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING)
_READINESS = (NODE_STATES.c.node_id, NODE_STATES.c.status, NODE_STATES.c.branch)
_RUNNABLE = (JobStatus.QUEUED, JobStatus.PARKED)


class SqlStore(ScheduleQueries, AccessQueries, DeadLetterQueries, StatsQueries, RecoveryQueries):
    """The store port over one SQLAlchemy session (PostgreSQL or SQLite); on PostgreSQL the
    hot path's statements (store.hot) run on the session's driver connection, or on the
    autocommit unit's own."""

    def __init__(
        self,
        session: Session | None = None,
        driver: hot.Driver | None = None,
        *,
        opens: Callable[[], Session] | None = None,
    ) -> None:
        """Over ``session``; or, in an autocommit unit, over ``driver`` (the connection of
        the hot statements) and a session that ``opens`` makes when another statement runs."""
        self._session = session
        self._opens = opens
        self._driver = driver

    @property
    def session(self) -> Session:
        if self._session is None:
            if self._opens is None:
                raise StoreError("this store has no session")
            self._session = self._opens()
        return self._session

    @session.setter  # (the query mixins declare ``session`` a plain attribute)
    def session(self, session: Session) -> None:
        self._session = session

    def _core(self, statement: Executable, params: Any = None) -> CursorResult[Any]:
        """Run a Core statement on the transaction's connection: statements that read
        records, never ORM objects, so the ORM's bookkeeping per statement (identity map,
        session synchronisation) buys nothing. The hottest go further (:meth:`_hot`)."""
        return self.session.connection().execute(statement, params)

    @property
    def _postgres(self) -> bool:
        return self._driver is not None or self.session.get_bind().dialect.name == "postgresql"

    def _hot(self, statement: hot.Statement, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run a statement of the hot path on the driver's connection (PostgreSQL only): the
        autocommit unit's, or the transaction's."""
        if self._driver is None:
            self._driver = hot.Driver.of(self.session.connection())
        return self._driver.rows(statement, params)

    # -- tenants --------------------------------------------------------------------------

    def trigger_target(self, tenant: str, workflow: str) -> tuple[uuid.UUID, uuid.UUID | None]:
        """The tenant's id and the id of its latest version of ``workflow`` (None: it has
        none), in one read; a missing tenant as :meth:`tenant_id` has it."""
        row = self._core(_TRIGGER_TARGET, {"tenant": tenant, "workflow": workflow}).one_or_none()
        if row is None:
            return self.tenant_id(tenant), None  # made now (the default): no workflow yet
        return row.id, row.workflow_id

    def tenant_id(self, name: str) -> uuid.UUID:
        found = self._core(select(Tenant.id).where(Tenant.name == name)).scalar()
        if found is not None:
            return cast(uuid.UUID, found)
        if name == DEFAULT_TENANT:
            return self.create_tenant(name)
        raise TenantNotFound(
            f"no tenant is named {name!r}; create it with `conveyor tenants create {name}`"
        )

    def create_tenant(self, name: str) -> uuid.UUID:
        """The tenant's id, the tenant made if it is new (a racing creation is no error).
        One guarded statement, without a savepoint: fine outside a transaction too."""
        dialect = self.session.get_bind().dialect.name
        make = pg_insert if dialect == "postgresql" else sqlite_insert
        self._core(make(TENANTS).values(name=name).on_conflict_do_nothing())
        found = self._core(select(TENANTS.c.id).where(TENANTS.c.name == name)).scalar()
        if found is None:
            raise StoreError(f"could not create tenant {name!r}")
        return cast(uuid.UUID, found)

    def tenant_names(self) -> list[str]:
        return list(self.session.scalars(select(Tenant.name).order_by(Tenant.name)))

    def tenants(self) -> list[Tenant]:
        return list(self.session.scalars(select(Tenant).order_by(Tenant.name)))

    def set_tenant_concurrency(self, name: str, limit: int | None) -> bool:
        """Set (or, with None, clear) a tenant's own limit; False if there is no such tenant."""
        result = self.session.execute(
            update(Tenant).where(Tenant.name == name).values(max_concurrency=limit)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    # -- workflows ------------------------------------------------------------------------

    def latest_workflow(self, tenant_id: uuid.UUID, name: str) -> WorkflowRecord | None:
        row = self._core(
            select(WORKFLOWS)
            .where(WORKFLOWS.c.tenant_id == tenant_id, WORKFLOWS.c.name == name)
            .order_by(WORKFLOWS.c.version.desc())
            .limit(1)
        ).one_or_none()
        return workflow_record(row) if row else None

    def workflow(self, workflow_id: uuid.UUID) -> WorkflowRecord:
        row = self.session.get(WorkflowVersion, workflow_id)
        if row is None:
            raise WorkflowNotFound(f"no workflow version has id {workflow_id}")
        return workflow_record(row)

    def add_workflow_version(
        self,
        tenant_id: uuid.UUID,
        name: str,
        digest: str,
        definition: dict[str, Any],
        now: datetime,
    ) -> WorkflowRecord:
        latest = self.latest_workflow(tenant_id, name)
        row = WorkflowVersion(
            tenant_id=tenant_id,
            name=name,
            version=(latest.version + 1) if latest else 1,
            digest=digest,
            definition=definition,
            created_at=now,
        )
        self.session.add(row)
        self.session.flush()
        return workflow_record(row)

    def list_workflows(self, tenant_id: uuid.UUID) -> list[WorkflowRecord]:
        newest = (
            select(WorkflowVersion.name, func.max(WorkflowVersion.version).label("v"))
            .where(WorkflowVersion.tenant_id == tenant_id)
            .group_by(WorkflowVersion.name)
            .subquery()
        )
        rows = self.session.scalars(
            select(WorkflowVersion)
            .join(
                newest,
                (WorkflowVersion.name == newest.c.name) & (WorkflowVersion.version == newest.c.v),
            )
            .where(WorkflowVersion.tenant_id == tenant_id)
            .order_by(WorkflowVersion.name)
        )
        return [workflow_record(r) for r in rows]

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
                self._core(insert(JOBS).values(_start_job(execution, start_job, now)))
            return Created.CREATED
        jobs_ = [_node_job(execution, j, now) for j in jobs]
        if start_job is not None:
            jobs_.append(_start_job(execution, start_job, now))
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
                Job.status.in_([*_RUNNABLE, *WAITING_JOB]),
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
        which psycopg parses again: ~30 ms for 2,000)."""
        if self._postgres:
            ids = bindparam(None, list(node_ids), type_=ARRAY(String()))
            return NODE_STATES.c.node_id == any_(ids)
        return NODE_STATES.c.node_id.in_(list(node_ids))

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

    # -- jobs -----------------------------------------------------------------------------

    def add_node_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> None:
        """Insert node jobs, queued (or scheduled, with a ``next_run_at``), in one statement."""
        rows = [_node_job(execution, j, now) for j in jobs]
        if not self._postgres:
            self._core(insert(JOBS), [{**r, "execution_id": execution.id} for r in rows])
            return
        self._hot(hot.ADD_NODE_JOBS, {
            "queue": NODE_QUEUE, "priority": execution.priority.value,
            "tenant_id": execution.tenant_id, "workflow_id": execution.workflow_id,
            "execution_id": execution.id, "now": now,
            "job_ids": [r["id"] for r in rows], "job_statuses": [r["status"].value for r in rows],
            "job_nodes": [r["node_id"] for r in rows],
            "job_retries": [r["max_retries"] for r in rows],
            "job_next": [r["next_run_at"] for r in rows],
        })  # fmt: skip

    def claim_job(self, job_id: uuid.UUID, kind: JobKind, now: datetime) -> JobRecord | None:
        """queued (or parked) -> processing; None when the job is not a runnable job of that
        kind (a duplicate or misrouted message)."""
        row = self._core(
            update(JOBS)
            .where(JOBS.c.id == job_id, JOBS.c.kind == kind, JOBS.c.status.in_(_RUNNABLE))
            .values(status=JobStatus.PROCESSING, processed_at=now, heartbeat_at=now)
            .returning(*JOBS.c)
        ).one_or_none()
        return job_record(row) if row else None

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
            params = {"id": job_id, "now": now, "worker": worker, "needs": list(needs)}
            rows = self._hot(hot.CLAIM_NODE, params)
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
            "successors": list(successors),
            "finishes": finish is not None,
            "execution_output": finish.output if finish is not None else None,
        }
        return bool(self._hot(hot.COMPLETE_ALONE, params)[0][0])

    def job(self, job_id: uuid.UUID) -> JobRecord | None:
        row = self.session.get(Job, job_id)
        return job_record(row) if row else None

    def transition_job(
        self, job_id: uuid.UUID, expected: JobStatus, new: JobStatus, **values: Any
    ) -> bool:
        result = self._core(
            update(JOBS)
            .where(JOBS.c.id == job_id, JOBS.c.status == expected)
            .values(status=new, **values)
        )
        return bool(result.rowcount)

    def schedule_retry(self, job_id: uuid.UUID, next_run_at: datetime, error: str) -> bool:
        result = self.session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.PROCESSING)
            .values(
                status=JobStatus.RETRY_WAIT,
                retry_count=Job.retry_count + 1,
                next_run_at=next_run_at,
                last_error=error,
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    def promote_due(self, now: datetime, limit: int) -> list[JobRecord]:
        """Move waiting jobs whose time has come to queued, skipping rows another promoter
        holds; the caller publishes them after commit."""
        due = (
            select(Job.id)
            .where(Job.status.in_(list(WAITING_JOB)), Job.next_run_at <= now)
            .order_by(Job.next_run_at)
            .limit(limit)
        )
        return self._take(
            due, Job.status.in_(list(WAITING_JOB)), status=JobStatus.QUEUED, enqueued_at=now
        )

    def _take(self, due: Select[uuid.UUID], still: Any, **values: Any) -> list[JobRecord]:
        """Lock the rows ``due`` selects, skipping those another worker holds, and update
        those that still match ``still``."""
        ids = list(self.session.scalars(due.with_for_update(skip_locked=True)))
        if not ids:
            return []
        rows = self.session.scalars(
            update(Job).where(Job.id.in_(ids), still).values(**values).returning(Job),
            execution_options={"synchronize_session": False},
        ).all()
        return [job_record(r) for r in rows]

    def admission(self, job_id: uuid.UUID) -> Admission | None:
        """What the limiter needs to know about a node job, or None if there is no such job."""
        row = self._core(_ADMISSION, {"job_id": job_id}).one_or_none()
        if row is None:
            return None
        return Admission(
            job_id=job_id,
            status=row.status,
            kind=row.kind,
            tenant_id=row.tenant_id,
            workflow_id=row.workflow_id,
            priority=row.priority,
            enqueued_at=row.enqueued_at,
            tenant_concurrency=row.max_concurrency,
        )

    def tenant_concurrency(self, tenant_id: uuid.UUID) -> int | None:
        """The tenant's own concurrency limit (None: the default applies)."""
        return cast(int | None, self._core(_TENANT_LIMIT, {"tenant_id": tenant_id}).scalar())

    def park_job(self, job_id: uuid.UUID) -> bool:
        """queued -> parked: the job waits for a permit without a message in the broker."""
        return self.transition_job(job_id, JobStatus.QUEUED, JobStatus.PARKED)

    def parked_jobs(self, after: uuid.UUID | None, limit: int) -> list[tuple[uuid.UUID, Priority]]:
        """Parked jobs in id order from ``after`` (a cursor, so a sweep covers them all)."""
        query = select(Job.id, Job.priority).where(Job.status == JobStatus.PARKED)
        if after is not None:
            query = query.where(Job.id > after)
        rows = self.session.execute(query.order_by(Job.id).limit(limit)).all()
        return [(r.id, r.priority) for r in rows]

    def age_queued(self, cutoff: datetime, limit: int) -> list[JobRecord]:
        """Low jobs queued since before ``cutoff`` become normal; the caller re-publishes
        them at normal priority (the old message finds the job taken and is dropped)."""
        due = (
            select(Job.id)
            .where(
                Job.status == JobStatus.QUEUED,
                Job.priority == Priority.LOW,
                Job.enqueued_at < cutoff,
            )
            .limit(limit)
        )
        return self._take(due, Job.status == JobStatus.QUEUED, priority=Priority.NORMAL)

    # -- attempts -------------------------------------------------------------------------

    def add_attempt(self, job: JobRecord, worker: str | None, now: datetime) -> None:
        """The row of the try a claim of ``job`` starts, with how long the job waited."""
        waited = (now - job.enqueued_at).total_seconds() if job.enqueued_at else None
        self._core(
            insert(ATTEMPTS).values(
                job_id=job.id,
                attempt_number=job.try_number,
                status=AttemptStatus.RUNNING,
                worker=worker,
                started_at=now,
                waited=max(0.0, waited) if waited is not None else None,
            )
        )

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
    ) -> None:
        self._core(
            update(ATTEMPTS)
            .where(ATTEMPTS.c.job_id == job_id, ATTEMPTS.c.attempt_number == number)
            .values(
                status=status, finished_at=now, duration=duration, error=error, timed_out=timed_out
            )
        )

    # -- reads for people -----------------------------------------------------------------

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


# A new job's row, but for its execution_id: a node job's, an execution's start job's.


def _node_job(execution: ExecutionRecord, job: NewJob, now: datetime) -> dict[str, Any]:
    return {
        "id": job.id, "kind": JobKind.NODE, "queue": NODE_QUEUE, "data": {},
        "status": JobStatus.SCHEDULED if job.next_run_at else JobStatus.QUEUED,
        "priority": execution.priority, "max_retries": job.max_retries, "retry_count": 0,
        "tries_before": 0, "tenant_id": execution.tenant_id,
        "workflow_id": execution.workflow_id, "node_id": job.node_id,
        "next_run_at": job.next_run_at, "created_at": now, "enqueued_at": now,
    }  # fmt: skip


def _start_job(execution: ExecutionRecord, job_id: uuid.UUID, now: datetime) -> dict[str, Any]:
    return {
        "id": job_id, "kind": JobKind.EXECUTION, "queue": EXECUTION_QUEUE, "data": {},
        "status": JobStatus.QUEUED, "priority": execution.priority, "max_retries": 0,
        "retry_count": 0, "tries_before": 0, "tenant_id": execution.tenant_id,
        "workflow_id": execution.workflow_id, "node_id": None, "next_run_at": None,
        "created_at": now, "enqueued_at": now,
    }  # fmt: skip


# Statements of the hot path built once (their construction cost more than their execution).
TENANTS = cast(Table, Tenant.__table__)
_ADMISSION = (
    select(
        JOBS.c.status,
        JOBS.c.kind,
        JOBS.c.tenant_id,
        JOBS.c.workflow_id,
        JOBS.c.priority,
        JOBS.c.enqueued_at,
        TENANTS.c.max_concurrency,
    )
    .join(TENANTS, TENANTS.c.id == JOBS.c.tenant_id)
    .where(JOBS.c.id == bindparam("job_id"))
)
_LATEST = (
    select(WORKFLOWS.c.id)
    .where(WORKFLOWS.c.tenant_id == TENANTS.c.id, WORKFLOWS.c.name == bindparam("workflow"))
    .order_by(WORKFLOWS.c.version.desc())
    .limit(1)
    .scalar_subquery()
)
_TRIGGER_TARGET = select(TENANTS.c.id, _LATEST.label("workflow_id")).where(
    TENANTS.c.name == bindparam("tenant")
)
_TENANT_LIMIT = select(TENANTS.c.max_concurrency).where(TENANTS.c.id == bindparam("tenant_id"))
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
