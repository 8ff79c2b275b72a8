"""The hot path's statements, run on the driver's own connection (PostgreSQL, psycopg).

A trigger, a claim and an outcome are sent once per node (and a settle's jobs insert once
per node that makes others ready). Through SQLAlchemy's Connection
each cost more client CPU (connection and transaction objects, result metadata, bind and
result processing) than the server spent running it. These statements are fixed text,
compiled once for psycopg; their parameters are plain values and their rows are read by
position. Errors come out as SQLAlchemy's (``DBAPIError`` and its subclasses, a lost
connection invalidated), as they would through the engine: callers retry them unchanged.

Only for PostgreSQL: SQLite runs the same transitions as a few statements each
(:mod:`conveyor.store.sqlite`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, cast

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import (
    JSON,
    BindParameter,
    Boolean,
    Connection,
    Dialect,
    Float,
    Integer,
    String,
    TextClause,
    Uuid,
    bindparam,
    text,
)
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import Pool, PoolProxiedConnection

from conveyor.engine.records import ExecutionRecord, JobRecord, Limits
from conveyor.engine.states import RUNNABLE_JOB, ExecutionStatus, JobKind, JobStatus, Priority
from conveyor.models.base import JsonType, UTCDateTime
from conveyor.store.rows import parent_link, trace_context

_DIALECT: Dialect = psycopg_dialect()  # type: ignore[no-untyped-call]


class Statement:
    """A fixed statement compiled once for psycopg (``%(name)s`` placeholders, with the
    casts its typed parameters need); ``json`` names the parameters sent as jsonb."""

    def __init__(self, clause: TextClause) -> None:
        compiled = clause.compile(dialect=_DIALECT)
        self.sql = str(compiled)
        self.json = tuple(
            name
            for name, bind in compiled.binds.items()
            if isinstance(bind.type.dialect_impl(_DIALECT), JSON)
        )


class Driver:
    """Runs :class:`Statement` s on one psycopg connection: an autocommit unit's own (see
    :meth:`conveyor.store.Database.autocommit`) or a transaction's."""

    def __init__(
        self, connection: Any, dialect: Dialect, lost: Callable[[BaseException], None]
    ) -> None:
        self._connection: psycopg.Connection[Any] = connection
        self._dialect = dialect
        self._lost = lost

    @classmethod
    def of(cls, connection: Connection) -> Driver:
        """The driver connection under a SQLAlchemy connection (inside its transaction)."""
        pooled = connection.connection

        def lost(exc: BaseException) -> None:
            invalidate_pool(connection.engine.pool, pooled, exc)
            connection.invalidate(exc)

        return cls(pooled.driver_connection, connection.dialect, lost)

    def rows(self, statement: Statement, values: dict[str, Any]) -> list[tuple[Any, ...]]:
        params = {**values, **{name: Jsonb(values[name]) for name in statement.json}}
        with self._translated(statement.sql, params), self._connection.cursor() as cursor:
            cursor.execute(statement.sql, params)
            # (``cursor.description`` would build a column object per column, every call)
            result = cursor.pgresult
            return cursor.fetchall() if result is not None and result.nfields else []

    def ping(self) -> None:
        """The dialect's ping, as the pool's (store.engines) does it: fails as :meth:`rows` does
        if the server is gone."""
        with self._translated("-- ping", None):
            self._dialect.do_ping(cast(Any, self._connection))

    def set_autocommit(self, on: bool) -> None:
        """Each statement its own transaction (on), or not (as the pool hands them out)."""
        with self._translated("-- set autocommit", None):
            self._connection.autocommit = on

    @contextmanager
    def _translated(self, sql: str, params: dict[str, Any] | None) -> Iterator[None]:
        """psycopg's errors as SQLAlchemy's, a lost connection reported to ``lost``."""
        try:
            yield
        except psycopg.Error as exc:
            lost = self._dialect.is_disconnect(cast(Any, exc), cast(Any, self._connection), None)
            if lost:
                self._lost(exc)
            raise DBAPIError.instance(
                sql, params, exc, psycopg.Error, hide_parameters=True,
                connection_invalidated=lost, dialect=self._dialect,
            ) from exc  # fmt: skip


def invalidate_pool(pool: Pool, pooled: PoolProxiedConnection, exc: BaseException) -> None:
    """As the engine does when a statement finds the server gone: every connection made
    before now is replaced at its next checkout (the server likely dropped them all)."""
    pool._invalidate(pooled, exc, _checkin=False)


JOB_COLUMNS = (
    "id, kind, queue, status, priority, max_retries, retry_count, tries_before, enqueued_at, "
    "tenant_id, workflow_id, execution_id, node_id"
)


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def job_of(row: Sequence[Any]) -> JobRecord:
    """A job from the first columns of a row (:data:`JOB_COLUMNS`' order)."""
    return JobRecord(
        id=row[0], kind=JobKind(row[1]), queue=row[2], status=JobStatus(row[3]),
        priority=Priority(row[4]), max_retries=row[5], retry_count=row[6],
        tries_before=row[7], enqueued_at=_utc(row[8]), tenant_id=row[9], workflow_id=row[10],
        execution_id=row[11], node_id=row[12],
    )  # fmt: skip


def claimed(row: Sequence[Any]) -> tuple[JobRecord, ExecutionRecord, dict[str, Any]]:
    """A row of :data:`CLAIM_NODE`: the job, its execution, the outputs of the needs read."""
    job = job_of(row)
    if row[24] is not None:  # a map's item: its index and value
        job = replace(job, item_index=row[24], item=row[25])
    execution = ExecutionRecord(
        id=job.execution_id, tenant_id=job.tenant_id, workflow_id=job.workflow_id,
        status=ExecutionStatus(row[13]), priority=Priority(row[14]), input=row[15],
        created_at=row[16].astimezone(UTC), scheduled_for=_utc(row[17]),
        trace=trace_context(row[18], row[19]), limits=Limits.of(row[21], row[22]),
        reruns=row[23],
        parent=parent_link(row[26], row[27], row[28], row[29]), depth=row[30],
    )  # fmt: skip
    return job, execution, row[20] or {}


# Nodes of an execution are found by name one at a time, each by a LATERAL lookup on the
# (execution_id, node_id) index, because PostgreSQL estimates an execution's rows from the
# average execution, which is small: for ``node_id = ANY(:names)`` the generic plan it keeps
# for a prepared statement takes the execution's rows by the index's first column and filters
# them by name, so each node of a wide fan-out would read every node's row (the measurements:
# docs/architecture.md and docs/benchmarks-history.md).

# A job found by its key has its status compared as ``status || ''``, an expression no index
# holds (store.session.unindexed): compared as the column, a generic plan made while the
# statistics said few jobs had that status takes the job by a status index and filters by id,
# and then reads a whole backlog (the plain status index) or every processing job (the
# heartbeat's partial index) for each claim and success.

# The claim of a node job in one round trip (PostgreSQL): the job, its execution, the try's
# attempt row and the node's state, as claim_job + execution + add_attempt + start_node do.
# A map's item leaves its node's state alone: that row is the map's counter, which the items'
# claims would otherwise all queue for (and its status is the map's, running until it ends).
# The execution's input is returned only when asked for (``input``): an item whose templates
# do not read it is not sent the list its map may have come from, once per item.
# The claim's commit does not wait for its WAL flush (``synchronous_commit`` off for its own
# transaction, ``relaxed``): only a crash of the server can lose it, within the WAL writer's
# delay, and then the job is queued again as if the claim had never happened, and the sweep
# sends it again, which at-least-once already allows (a worker's crash does the same). Every
# later commit of the try (its success, failure or heartbeat) is flushed, and a flush takes
# the claim's WAL with it: a try's outcome is never durable without its claim
# (docs/guarantees.md#what-a-commit-waits-for).
_CLAIM = """
WITH relaxed AS (
    SELECT {relaxed} AS setting
), job AS (
    UPDATE jobs SET status = 'processing', processed_at = :now, heartbeat_at = :now
    WHERE id = :id AND kind = 'node' AND status || '' IN ({runnable})
      AND node_id IS NOT NULL{ahead}
    RETURNING *
), ex AS (
    SELECT executions.* FROM executions JOIN job ON executions.id = job.execution_id
), attempt AS (
    INSERT INTO job_attempts (job_id, attempt_number, status, worker, started_at, waited,
                              timed_out, queue, workflow_id)
    SELECT job.id, job.tries_before + job.retry_count + 1, 'running', :worker, :now,
           greatest(0, extract(epoch FROM (CAST(:now AS timestamptz) - job.enqueued_at))),
           false, job.queue, job.workflow_id
    FROM job, ex WHERE ex.status IN ('pending', 'running')
), node AS (
    UPDATE node_states SET status = 'running',
                           started_at = coalesce(node_states.started_at, :now)
    FROM job, ex
    WHERE ex.status IN ('pending', 'running') AND node_states.execution_id = job.execution_id
      AND node_states.node_id = job.node_id AND job.item_index IS NULL
)
SELECT {job_columns}, ex.status AS x_status, ex.priority AS x_priority,
       CASE WHEN :input THEN ex.input END AS x_input, ex.created_at AS x_created_at,
       ex.scheduled_for AS x_scheduled_for,
       ex.traceparent AS x_traceparent, ex.tracestate AS x_tracestate, {needs},
       ex.max_attempts AS x_max_attempts, ex.timeout AS x_timeout, ex.reruns AS x_reruns,
       job.item_index AS x_item_index, job.item AS x_item,
       ex.parent_execution_id AS x_parent_execution_id, ex.parent_node_id AS x_parent_node_id,
       ex.parent_job_id AS x_parent_job_id, ex.parent_try AS x_parent_try, ex.depth AS x_depth
FROM job, ex, relaxed
"""
_NEEDS = """(SELECT jsonb_object_agg(w.node_id, n.output)
        FROM unnest(CAST(:needs AS varchar[])) AS w (node_id)
        CROSS JOIN LATERAL (SELECT s.output FROM node_states s
                            WHERE s.execution_id = job.execution_id AND s.node_id = w.node_id
                            LIMIT 1) AS n) AS x_needs"""
_RUNNABLE = ", ".join(f"'{status.value}'" for status in RUNNABLE_JOB)
_JOB_COLUMNS = ", ".join(f"job.{c}" for c in JOB_COLUMNS.split(", "))
_CLAIM_PARAMS = (
    bindparam("id", type_=Uuid()),
    bindparam("now", type_=UTCDateTime()),
    bindparam("worker", type_=String()),
    bindparam("input", type_=Boolean()),
)


_RELAXED = "set_config('synchronous_commit', 'off', true)"


def _claim(
    needs: str, *params: BindParameter[Any], ahead: str = "", relaxed: str = _RELAXED
) -> Statement:
    """A node job's claim reading ``needs`` (a column), with ``ahead``'s guard if any, its
    commit ``relaxed`` or not (see _CLAIM)."""
    claim = _CLAIM.format(
        job_columns=_JOB_COLUMNS, needs=needs, runnable=_RUNNABLE, ahead=ahead, relaxed=relaxed
    )
    return Statement(text(claim).bindparams(*_CLAIM_PARAMS, *params))


CLAIM_NODE = _claim(_NEEDS)
# The same claim reading no needs' outputs. A statement that unnests an array parameter is
# planned again at every run: its generic plan counts on the function's hundred rows, a custom
# plan on the array's actual few, and PostgreSQL keeps a generic plan only while it costs
# about what the custom ones did (pg_prepared_statements: 0 generic, 115 custom plans of 115).
# So the common cases, no name or one name to look up (a root, a chain's or a fan-out's
# member), run statements without one, planned once.
CLAIM_NODE_ALONE = _claim("NULL AS x_needs")
_NEED = """(SELECT jsonb_build_object(s.node_id, s.output) FROM node_states s
        WHERE s.execution_id = job.execution_id AND s.node_id = :need
        LIMIT 1) AS x_needs"""
CLAIM_NODE_AFTER_ONE = _claim(_NEED, bindparam("need", type_=String()))


# The same claims for a continuation (Store.claim_continuation): only while no node job of a
# priority above the claimer's (:above1, :above2; NULL for none) is queued in :queue
# (ix_jobs_queued_priority: one equality lookup a priority, none for a high job's claim; an IN
# list's generic plan took the status index and read every queued job), in the claim's own
# statement. Not relaxed: a continuation's
# claim may run in its predecessor's success's transaction (a join's, see
# service.continuing.Continuations._complete), whose commit must be flushed as every success's.
_NONE_AHEAD = """(CAST(:above1 AS varchar) IS NULL OR NOT EXISTS (
          SELECT 1 FROM jobs ahead WHERE ahead.status = 'queued' AND ahead.priority = :above1
                                     AND ahead.queue = :queue AND ahead.kind = 'node'))
      AND (CAST(:above2 AS varchar) IS NULL OR NOT EXISTS (
          SELECT 1 FROM jobs ahead WHERE ahead.status = 'queued' AND ahead.priority = :above2
                                     AND ahead.queue = :queue AND ahead.kind = 'node'))"""
_AHEAD = "\n      AND " + _NONE_AHEAD
_AHEAD_PARAMS = (
    bindparam("above1", type_=String()),
    bindparam("above2", type_=String()),
    bindparam("queue", type_=String()),
)


CONTINUE_NODE = _claim(_NEEDS, *_AHEAD_PARAMS, ahead=_AHEAD, relaxed="NULL")
CONTINUE_NODE_ALONE = _claim("NULL AS x_needs", *_AHEAD_PARAMS, ahead=_AHEAD, relaxed="NULL")
CONTINUE_NODE_AFTER_ONE = _claim(
    _NEED, bindparam("need", type_=String()), *_AHEAD_PARAMS, ahead=_AHEAD, relaxed="NULL"
)

# A node's success in one round trip (PostgreSQL), when its execution still runs: what
# transition_job + finish_attempt + set_node do on complete_node's common path.
_COMPLETE_CTES = """
WITH {before}job AS (
    UPDATE jobs SET status = 'completed', completed_at = :now, last_error = NULL
    WHERE id = :id AND status || '' = 'processing'
      AND tries_before + retry_count + 1 = :attempt{guard}
      AND (SELECT status FROM executions WHERE id = :execution_id) IN ('pending', 'running')
    RETURNING id
), attempt AS (
    UPDATE job_attempts SET status = 'succeeded', finished_at = :now, duration = :duration,
                            error = NULL, timed_out = false
    WHERE job_id = :id AND attempt_number = :attempt AND EXISTS (SELECT 1 FROM job)
), node AS (
    UPDATE node_states SET status = 'completed', output = :output, branch = :branch,
                           finished_at = :now, error = NULL
    WHERE execution_id = :execution_id AND node_id = :node_id AND EXISTS (SELECT 1 FROM job)
    RETURNING 1
)"""
_COMPLETE_PARAMS = (
    bindparam("id", type_=Uuid()),
    bindparam("execution_id", type_=Uuid()),
    bindparam("node_id", type_=String()),
    bindparam("attempt", type_=Integer()),
    bindparam("output", type_=JsonType),
    bindparam("branch", type_=String()),
    bindparam("now", type_=UTCDateTime()),
    bindparam("duration", type_=Float()),
)
COMPLETE_NODE = Statement(
    text(_COMPLETE_CTES.format(before="", guard="") + "\nSELECT count(*) FROM job").bindparams(
        *_COMPLETE_PARAMS
    )
)
# A node's whole success in one statement when it makes no successor ready: its successors
# (locked first, in one order) all wait on another node too. They count one need fewer, the
# execution one node fewer and, for a node nothing waits on whose output makes the
# execution's (:finishes), the execution completes when it was the last. Otherwise nothing
# changes, and the caller takes the transaction (enqueueing what becomes ready). A successor
# still waiting on another node is unsettled, so the count cannot reach zero unfinished.
# Row locks: the successors, the job, the node, the execution (it reads node, which reads
# job; unread, a CTE runs at the statement's end in no order to rely on): the order of every
# other transaction, and of the status NOTIFYs a stream relays.
_LOCK_SUCCESSORS = """
    SELECT n.id, n.waiting_on, n.status
    FROM (SELECT u.node_id FROM unnest(CAST(:successors AS varchar[])) AS u (node_id)
          ORDER BY u.node_id) AS w
    CROSS JOIN LATERAL (SELECT s.id, s.waiting_on, s.status FROM node_states s
                        WHERE s.execution_id = :execution_id AND s.node_id = w.node_id
                        FOR UPDATE) AS n
"""
_ALONE_AFTER = """, counted AS (
    UPDATE node_states SET waiting_on = waiting_on - 1
    WHERE id IN (SELECT id FROM locked) AND EXISTS (SELECT 1 FROM node)
    RETURNING 1
), settled AS (
    UPDATE executions SET
        remaining_nodes = remaining_nodes - 1,
        status = CASE WHEN remaining_nodes = 1 AND :finishes THEN 'completed' ELSE status END,
        finished_at = CASE WHEN remaining_nodes = 1 AND :finishes THEN :now ELSE finished_at END,
        output = CASE WHEN remaining_nodes = 1 AND :finishes THEN :execution_output
                      ELSE output END
    WHERE id = :execution_id AND status = 'running' AND EXISTS (SELECT 1 FROM node)
      AND (SELECT count(*) FROM counted) >= 0
)
SELECT count(*) FROM job"""
_ALONE_PARAMS = (
    *_COMPLETE_PARAMS,
    bindparam("finishes", type_=Boolean()),
    bindparam("execution_output", type_=JsonType),
)
# Whether no successor becomes ready: each still waits on another node, none settled.
_ALONE = """), alone AS (
    SELECT NOT EXISTS (SELECT 1 FROM locked WHERE waiting_on <= 1 OR status <> 'pending') AS yes
), """


def _complete_alone(locked: str, *params: BindParameter[Any]) -> Statement:
    """The success of a node whose successors ``locked`` (a CTE's body) locks, if alone."""
    return Statement(
        text(
            _COMPLETE_CTES.format(
                before=f"locked AS ({locked}{_ALONE}", guard=" AND (SELECT yes FROM alone)"
            )
            + _ALONE_AFTER
        ).bindparams(*_ALONE_PARAMS, *params)
    )


COMPLETE_ALONE = _complete_alone(_LOCK_SUCCESSORS)
# The same for a node without successors: nothing to lock, no array to unnest (see
# CLAIM_NODE_ALONE: planned once, not at every run).
_NO_SUCCESSORS = """locked AS (
    SELECT id, waiting_on, status FROM node_states WHERE false
), """
COMPLETE_LAST = Statement(
    text(_COMPLETE_CTES.format(before=_NO_SUCCESSORS, guard="") + _ALONE_AFTER).bindparams(
        *_ALONE_PARAMS
    )
)
# And for a node with one successor (a chain's or a fan-out's member), found by its name.
_LOCK_SUCCESSOR = """
    SELECT s.id, s.waiting_on, s.status FROM node_states s
    WHERE s.execution_id = :execution_id AND s.node_id = :successor
    FOR UPDATE
"""
COMPLETE_BEFORE_ONE = _complete_alone(_LOCK_SUCCESSOR, bindparam("successor", type_=String()))


# A chain's step in one statement (Jobs.complete_step): a node's success when it makes its
# one successor ready (that node pending and waiting on it alone, the execution running), the
# execution one node fewer, the successor's job inserted and its need counted and, with
# :claim and while no node job of a priority above the execution's (:above1, :above2; NULL
# for none) is queued in the node queue, the job claimed for :worker as CLAIM_NODE claims
# one (processing, its first try running, its node running); else queued, its node queued.
# Row locks in the order of every other transaction (COMPLETE_BEFORE_ONE's): the successor,
# the job, the node, the execution. Nothing changes, and no row comes back, in any other
# case: the caller takes the transaction. (One race is COMPLETE_ALONE's too: a cancel that
# commits while this statement waits for the execution's row leaves the node completed and
# the execution cancelled, no successor made; the caller's transaction then finds the job
# done and changes nothing more.) The success is flushed at commit as any success;
# the claim rides in it (a claim alone commits relaxed, see _CLAIM).
# The output its claim reads is the one this statement writes, as the parameter sent (the
# statement's snapshot does not see its own writes).
_STEP_LOCK = """locked AS (
    SELECT s.id, s.waiting_on, s.status FROM node_states s
    WHERE s.execution_id = :execution_id AND s.node_id = :successor
    FOR UPDATE
), ready AS (
    SELECT EXISTS (SELECT 1 FROM locked WHERE waiting_on = 1 AND status = 'pending') AS yes
), """
_STEP_GUARD = """ AND (SELECT yes FROM ready)
      AND (SELECT status FROM executions WHERE id = :execution_id) = 'running'"""
_STEP = """, ex AS (
    UPDATE executions SET remaining_nodes = remaining_nodes - 1
    WHERE id = :execution_id AND status = 'running' AND EXISTS (SELECT 1 FROM node)
    RETURNING *
), above AS (
    SELECT :claim AND {none_ahead} AS claimed
), next AS (
    INSERT INTO jobs (id, kind, queue, data, status, priority, max_retries, retry_count,
                      tries_before, tenant_id, workflow_id, execution_id, node_id,
                      created_at, enqueued_at, processed_at, heartbeat_at)
    SELECT :next_id, 'node', CAST(:queue AS varchar), '{{}}',
           CASE WHEN above.claimed THEN 'processing' ELSE 'queued' END, ex.priority,
           :max_retries, 0, 0, ex.tenant_id, ex.workflow_id, ex.id, :successor, :now, :now,
           CASE WHEN above.claimed THEN CAST(:now AS timestamptz) END,
           CASE WHEN above.claimed THEN CAST(:now AS timestamptz) END
    FROM ex, above
    RETURNING *
), counted AS (
    UPDATE node_states SET
        waiting_on = waiting_on - 1,
        status = CASE WHEN (SELECT claimed FROM above) THEN 'running' ELSE 'queued' END,
        started_at = CASE WHEN (SELECT claimed FROM above) THEN CAST(:now AS timestamptz)
                          ELSE started_at END
    WHERE id IN (SELECT id FROM locked) AND EXISTS (SELECT 1 FROM next)
), try AS (
    INSERT INTO job_attempts (job_id, attempt_number, status, worker, started_at, waited,
                              timed_out, queue, workflow_id)
    SELECT next.id, 1, 'running', :worker, :now, 0, false, next.queue, next.workflow_id
    FROM next WHERE next.status = 'processing'
)
SELECT {job_columns}, ex.status AS x_status, ex.priority AS x_priority,
       ex.input AS x_input, ex.created_at AS x_created_at,
       ex.scheduled_for AS x_scheduled_for,
       ex.traceparent AS x_traceparent, ex.tracestate AS x_tracestate,
       jsonb_build_object(CAST(:node_id AS varchar), :output) AS x_needs,
       ex.max_attempts AS x_max_attempts, ex.timeout AS x_timeout, ex.reruns AS x_reruns,
       next.item_index AS x_item_index, next.item AS x_item,
       ex.parent_execution_id AS x_parent_execution_id, ex.parent_node_id AS x_parent_node_id,
       ex.parent_job_id AS x_parent_job_id, ex.parent_try AS x_parent_try, ex.depth AS x_depth
FROM next, ex
"""
COMPLETE_STEP = Statement(
    text(
        _COMPLETE_CTES.format(before=_STEP_LOCK, guard=_STEP_GUARD)
        + _STEP.format(
            job_columns=", ".join(f"next.{c}" for c in JOB_COLUMNS.split(", ")),
            none_ahead=_NONE_AHEAD,
        )
    ).bindparams(
        *_COMPLETE_PARAMS,
        bindparam("successor", type_=String()),
        bindparam("next_id", type_=Uuid()),
        bindparam("max_retries", type_=Integer()),
        bindparam("claim", type_=Boolean()),
        bindparam("above1", type_=String()),
        bindparam("above2", type_=String()),
        bindparam("queue", type_=String()),
        bindparam("worker", type_=String()),
    )
)

# An execution with its node states and first jobs, in one statement (PostgreSQL). A taken
# idempotency or deduplication key, or a child's (parent job, try), inserts nothing: the rows
# hang off ``made``'s RETURNING. Nor does a workflow version that is not the tenant's latest
# any more (``target``): the caller planned it from what it knew, and plans again. Without
# names (a child's version, read in the caller's transaction) there is nothing to check.
CREATE_EXECUTION = Statement(
    text(
        """
WITH target AS (
    SELECT CASE WHEN CAST(:workflow_name AS varchar) IS NULL THEN true
        ELSE (SELECT w.id FROM workflows w JOIN tenants t ON t.id = w.tenant_id
              WHERE t.id = :tenant_id AND t.name = :tenant_name AND w.name = :workflow_name
              ORDER BY w.version DESC LIMIT 1) = :workflow_id
    END AS latest
), made AS (
    INSERT INTO executions (id, tenant_id, workflow_id, status, priority, trigger, input,
                            remaining_nodes, started_at, created_at, idempotency_key,
                            dedupe_key, traceparent, tracestate, scheduled_for,
                            max_attempts, timeout, parent_execution_id, parent_node_id,
                            parent_job_id, parent_try, depth)
    SELECT :id, :tenant_id, :workflow_id, CAST(:status AS varchar),
           CAST(:priority AS varchar), CAST(:trigger AS varchar), :input, :remaining_nodes,
           CAST(:started_at AS timestamptz), :now, CAST(:idempotency_key AS varchar),
           CAST(:dedupe_key AS varchar), CAST(:traceparent AS varchar),
           CAST(:tracestate AS varchar), CAST(:scheduled_for AS timestamptz),
           CAST(:max_attempts AS integer), CAST(:timeout AS double precision),
           CAST(:parent_execution_id AS uuid), CAST(:parent_node_id AS varchar),
           CAST(:parent_job_id AS uuid), CAST(:parent_try AS integer), :depth
    FROM target WHERE target.latest
    ON CONFLICT DO NOTHING
    RETURNING id
), states AS (
    INSERT INTO node_states (execution_id, node_id, status, waiting_on)
    SELECT made.id, s.node_id, s.status, s.waiting_on
    FROM made, unnest(CAST(:state_nodes AS varchar[]), CAST(:state_statuses AS varchar[]),
                      CAST(:state_waiting AS integer[])) AS s (node_id, status, waiting_on)
), jobs AS (
    INSERT INTO jobs (id, kind, queue, data, status, priority, max_retries, retry_count,
                      tries_before, tenant_id, workflow_id, execution_id, node_id, next_run_at,
                      created_at, enqueued_at)
    SELECT j.id, j.kind, j.queue, '{}', j.status, :priority, j.max_retries, 0, 0, :tenant_id,
           :workflow_id, made.id, j.node_id, j.next_run_at, :now, :now
    FROM made, unnest(CAST(:job_ids AS uuid[]), CAST(:job_kinds AS varchar[]),
                      CAST(:job_queues AS varchar[]), CAST(:job_statuses AS varchar[]),
                      CAST(:job_nodes AS varchar[]), CAST(:job_retries AS integer[]),
                      CAST(:job_next AS timestamptz[]))
         AS j (id, kind, queue, status, node_id, max_retries, next_run_at)
)
SELECT coalesce((SELECT latest FROM target), false) AS latest,
       (SELECT count(*) FROM made) AS made
"""
    ).bindparams(
        bindparam("input", type_=JsonType),
        bindparam("now", type_=UTCDateTime()),
        bindparam("started_at", type_=UTCDateTime()),
        bindparam("scheduled_for", type_=UTCDateTime()),
        bindparam("depth", type_=Integer()),
    )
)


# Node jobs of a running execution in one statement (PostgreSQL): a wide fan-out's thousands
# of rows as a few arrays, not one INSERT per row.
ADD_NODE_JOBS = Statement(
    text(
        """
INSERT INTO jobs (id, kind, queue, data, status, priority, max_retries, retry_count,
                  tries_before, tenant_id, workflow_id, execution_id, node_id, next_run_at,
                  created_at, enqueued_at)
SELECT j.id, 'node', CAST(:queue AS varchar), '{}', j.status, CAST(:priority AS varchar),
       j.max_retries, 0, 0, :tenant_id, :workflow_id, :execution_id, j.node_id,
       j.next_run_at, :now, :now
FROM unnest(CAST(:job_ids AS uuid[]), CAST(:job_statuses AS varchar[]),
            CAST(:job_nodes AS varchar[]), CAST(:job_retries AS integer[]),
            CAST(:job_next AS timestamptz[])) AS j (id, status, node_id, max_retries, next_run_at)
"""
    ).bindparams(bindparam("now", type_=UTCDateTime()))
)


# A map's item's whole success in one statement (PostgreSQL), when it is not the map's last:
# its node state (the map's counter) locked first, then the job completed with its output, its
# try, the counter one item fewer and the held item its job names (data->>'releases', its
# index) released by the map's key, its row as a job's (skipping a held row another
# transaction holds: only a cancel, which cancels it).
# When the counter says it may be the last (or the node or the execution does not run, or the
# try is not current) nothing changes and no row comes back: the caller takes the transaction,
# which reads the items' outputs and settles the node.
_COMPLETE_ITEM = """
WITH locked AS (
    SELECT s.id, s.items_left, s.status FROM node_states s
    WHERE s.execution_id = :execution_id AND s.node_id = :node_id
    FOR UPDATE
), alone AS (
    SELECT EXISTS (SELECT 1 FROM locked WHERE items_left > 1 AND status = 'running') AS yes
), job AS (
    UPDATE jobs SET status = 'completed', completed_at = :now, last_error = NULL,
                    output = :output
    WHERE id = :id AND status || '' = 'processing'
      AND tries_before + retry_count + 1 = :attempt AND (SELECT yes FROM alone)
      AND (SELECT status FROM executions WHERE id = :execution_id) IN ('pending', 'running')
    RETURNING id, data
), attempt AS (
    UPDATE job_attempts SET status = 'succeeded', finished_at = :now, duration = :duration,
                            error = NULL, timed_out = false
    WHERE job_id = :id AND attempt_number = :attempt AND EXISTS (SELECT 1 FROM job)
), counted AS (
    UPDATE node_states SET items_left = items_left - 1
    WHERE id = (SELECT id FROM locked) AND EXISTS (SELECT 1 FROM job)
    RETURNING items_left, items_failed
), next AS (
    SELECT h.id FROM jobs h
    WHERE h.execution_id = :execution_id AND h.node_id = :node_id
      AND h.item_index = (SELECT CAST(data ->> 'releases' AS integer) FROM job)
      AND h.status || '' = 'held' AND EXISTS (SELECT 1 FROM counted)
    FOR UPDATE SKIP LOCKED
), released AS (
    UPDATE jobs SET status = 'queued', enqueued_at = :now
    WHERE id = (SELECT id FROM next) AND status || '' = 'held'
    RETURNING {job_columns}
)
SELECT counted.items_left, counted.items_failed, released.*
FROM counted LEFT JOIN released ON true
"""
COMPLETE_ITEM = Statement(
    text(_COMPLETE_ITEM.format(job_columns=JOB_COLUMNS)).bindparams(
        bindparam("id", type_=Uuid()),
        bindparam("execution_id", type_=Uuid()),
        bindparam("node_id", type_=String()),
        bindparam("attempt", type_=Integer()),
        bindparam("output", type_=JsonType),
        bindparam("now", type_=UTCDateTime()),
        bindparam("duration", type_=Float()),
    )
)
