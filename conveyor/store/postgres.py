"""The PostgreSQL adapter of the store port: the hot transitions (an execution's creation, a
node's claim and success, a batch of node jobs) as one statement each
(:mod:`conveyor.store.postgres_statements`), run on the driver's connection; an autocommit
unit runs them without a transaction around them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, ColumnElement, String, any_, bindparam, func, insert, select
from sqlalchemy.orm import Session

from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import (
    Created,
    EventRecord,
    ExecutionRecord,
    Finish,
    ItemsLeft,
    JobRecord,
    NewJob,
    Stepped,
    Succeeded,
)
from conveyor.engine.states import (
    ExecutionStatus,
    JobStatus,
    NodeStatus,
    Priority,
    priorities_above,
)
from conveyor.store import postgres_statements as hot
from conveyor.store.jobs import node_job_row, start_job_row
from conveyor.store.session import NODE_STATES
from conveyor.store.sql_store import SqlStore
from conveyor.store.waits import EVENTS

# The first key of the advisory locks of applies (the second is the tenant's): "conv".
APPLY_LOCK = 0x636F6E76
# The first key of the advisory locks of a wait and its events (the second, the correlation's
# hash): "wait".
WAIT_LOCK = 0x77616974


class PostgresStore(SqlStore):
    """The store on PostgreSQL, over a session, or (an autocommit unit) over ``driver``, the
    connection of the hot statements, and a session that ``opens`` makes when another
    statement runs."""

    def __init__(
        self,
        session: Session | None = None,
        driver: hot.Driver | None = None,
        *,
        opens: Callable[[], Session] | None = None,
    ) -> None:
        super().__init__(session, opens=opens)
        self._driver = driver

    def lock_applies(self, tenant_id: uuid.UUID) -> None:
        """``pg_advisory_xact_lock`` on (the applies' key, the tenant's id hashed): released
        at commit or rollback, and taken only by the applies of workflows that start
        children. A hash shared by two tenants makes them take turns, nothing worse."""
        self._core(select(func.pg_advisory_xact_lock(APPLY_LOCK, func.hashtext(str(tenant_id)))))

    def lock_correlation(self, tenant_id: uuid.UUID, event: str, key: str) -> None:
        """``pg_advisory_xact_lock`` on (the waits' key, the correlation hashed): held to
        commit or rollback. Two correlations sharing a hash take turns, nothing worse."""
        correlation = func.hashtext(f"{tenant_id}\x1f{event}\x1f{key}")
        self._core(select(func.pg_advisory_xact_lock(WAIT_LOCK, correlation)))

    def add_event(self, event: EventRecord) -> None:
        """Stamped by the database's clock (``statement_timestamp()``), as an execution's
        ``events_since`` is (its column's default): a wait compares the two, so a sender
        whose clock lags the trigger's loses no wake-up."""
        stamped = asdict(event) | {"created_at": func.statement_timestamp()}
        self.session.execute(insert(EVENTS).values(**stamped))

    def _hot(self, statement: hot.Statement, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run a statement of the hot path on the driver's connection: the autocommit
        unit's, or the transaction's."""
        if self._driver is None:
            self._driver = hot.Driver.of(self.session.connection())
        return self._driver.rows(statement, params)

    def _nodes_among(self, node_ids: Iterable[str]) -> ColumnElement[bool]:
        """``node_id = ANY(array)``: one parameter, however many nodes (a fan-out's thousands
        as an IN list would be a new statement text each time, which psycopg parses again).
        One node is ``node_id = :id``: the plan psycopg prepares for ``= ANY`` reads all the
        execution's rows and filters them by name (see the note above
        postgres_statements.CLAIM_NODE), a fan-out's thousands for each node."""
        wanted = list(node_ids)
        if len(wanted) == 1:
            return NODE_STATES.c.node_id == wanted[0]
        ids = bindparam(None, wanted, type_=ARRAY(String()))
        return NODE_STATES.c.node_id == any_(ids)

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
        """One statement (see :class:`~conveyor.engine.ports.Executions`)."""
        planned = waiting_on is not None
        jobs_ = [node_job_row(execution, j, now) for j in jobs]
        if start_job is not None:
            jobs_.append(start_job_row(execution, start_job, now))
        states = list((waiting_on or {}).items())
        parent = execution.parent
        params = {
            "id": execution.id, "tenant_id": execution.tenant_id,
            "workflow_id": execution.workflow_id,
            "status": (ExecutionStatus.RUNNING if planned else ExecutionStatus.PENDING).value,
            "priority": execution.priority.value, "trigger": trigger, "input": execution.input,
            "remaining_nodes": len(states), "started_at": now if planned else None, "now": now,
            "idempotency_key": idempotency_key, "dedupe_key": dedupe_key,
            "scheduled_for": execution.scheduled_for,
            "max_attempts": execution.limits.max_attempts if execution.limits else None,
            "timeout": execution.limits.timeout if execution.limits else None,
            "traceparent": execution.trace.traceparent if execution.trace else None,
            "tracestate": execution.trace.tracestate if execution.trace else None,
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
            "tenant_name": names[0] if names else None,
            "workflow_name": names[1] if names else None,
            "parent_execution_id": parent.execution_id if parent else None,
            "parent_node_id": parent.node_id if parent else None,
            "parent_job_id": parent.job_id if parent else None,
            "parent_try": parent.try_number if parent else None, "depth": execution.depth,
        }  # fmt: skip
        ((latest, made),) = self._hot(hot.CREATE_EXECUTION, params)
        if not latest:
            return Created.STALE
        return Created.CREATED if made else Created.KEY_TAKEN

    def add_node_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> None:
        """One statement, the rows as a few arrays."""
        rows = [node_job_row(execution, j, now) for j in jobs]
        self._hot(hot.ADD_NODE_JOBS, {
            "queue": NODE_QUEUE, "priority": execution.priority.value,
            "tenant_id": execution.tenant_id, "workflow_id": execution.workflow_id,
            "execution_id": execution.id, "now": now,
            "job_ids": [r["id"] for r in rows], "job_statuses": [r["status"].value for r in rows],
            "job_nodes": [r["node_id"] for r in rows],
            "job_retries": [r["max_retries"] for r in rows],
            "job_next": [r["next_run_at"] for r in rows],
        })  # fmt: skip

    def claim_node_job(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        """One statement, which also reads the outputs of ``needs``."""
        params = {"id": job_id, "now": now, "worker": worker, "input": input}
        return self._claim(params, needs, hot.CLAIM_NODE_ALONE, hot.CLAIM_NODE_AFTER_ONE,
                           hot.CLAIM_NODE)  # fmt: skip

    def claim_continuation(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        *,
        queue: str,
        priority: Priority,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        """One statement: the claim's, with its look for a job of a higher priority."""
        params = {
            "id": job_id, "now": now, "worker": worker, "input": input, "queue": queue,
            **_ahead(priority),
        }  # fmt: skip
        return self._claim(params, needs, hot.CONTINUE_NODE_ALONE, hot.CONTINUE_NODE_AFTER_ONE,
                           hot.CONTINUE_NODE)  # fmt: skip

    def _claim(
        self,
        params: dict[str, Any],
        needs: Sequence[str],
        alone: hot.Statement,
        after_one: hot.Statement,
        after_many: hot.Statement,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        # (no array parameter for none or one: planned once, see postgres_statements)
        if not needs:
            rows = self._hot(alone, params)
        elif len(needs) == 1:
            rows = self._hot(after_one, params | {"need": needs[0]})
        else:
            rows = self._hot(after_many, params | {"needs": list(needs)})
        if not rows:
            return None
        claimed, execution, outputs = hot.claimed(rows[0])
        # (the statement reads the needs' outputs whatever the execution's status; a node of a
        # finished one does not run, and gets none, as on SQLite)
        read = needs and not execution.status.finished
        return claimed, execution, (outputs if read else None)

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
        """One statement; with ``successors``, run alone it commits without a lock held
        across round trips."""
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
        # (no array parameter for none or one: planned once, see postgres_statements)
        if not successors:
            return bool(self._hot(hot.COMPLETE_LAST, params)[0][0])
        if len(successors) == 1:
            params["successor"] = successors[0]
            return bool(self._hot(hot.COMPLETE_BEFORE_ONE, params)[0][0])
        params["successors"] = list(successors)
        return bool(self._hot(hot.COMPLETE_ALONE, params)[0][0])

    def complete_step(
        self,
        succeeded: Succeeded,
        successor: NewJob,
        *,
        worker: str | None,
        claim: bool,
    ) -> Stepped | None:
        """One statement (:data:`~conveyor.store.postgres_statements.COMPLETE_STEP`)."""
        job = succeeded.job
        rows = self._hot(hot.COMPLETE_STEP, {
            "id": job.id, "execution_id": job.execution_id, "node_id": succeeded.node_id,
            "attempt": job.try_number, "output": succeeded.output, "branch": succeeded.branch,
            "now": succeeded.now, "duration": succeeded.duration,
            "successor": successor.node_id, "next_id": successor.id,
            "max_retries": successor.max_retries, "claim": claim, "queue": NODE_QUEUE,
            "worker": worker, **_ahead(succeeded.execution.priority),
        })  # fmt: skip
        if not rows:
            return None
        next_job, next_execution, outputs = hot.claimed(rows[0])
        if next_job.status is not JobStatus.PROCESSING:
            return Stepped()
        return Stepped(claimed=(next_job, next_execution, outputs))

    def complete_item_alone(
        self, job: JobRecord, node_id: str, output: Any, now: datetime, duration: float
    ) -> ItemsLeft | None:
        """One statement (:data:`~conveyor.store.postgres_statements.COMPLETE_ITEM`)."""
        rows = self._hot(hot.COMPLETE_ITEM, {
            "id": job.id, "execution_id": job.execution_id, "node_id": node_id,
            "attempt": job.try_number, "output": output, "now": now, "duration": duration,
        })  # fmt: skip
        if not rows:
            return None
        left, failed, *released = rows[0]
        return ItemsLeft(
            left=left, failed=failed, released=hot.job_of(released) if released[0] else None
        )


def _ahead(priority: Priority) -> dict[str, str | None]:
    """The parameters of a continuation's look for a queued job of a higher priority
    (``_NONE_AHEAD`` in postgres_statements): the priorities above ``priority``, NULL for
    none."""
    above = [p.value for p in priorities_above(priority)] + [None, None]
    return {"above1": above[0], "above2": above[1]}
