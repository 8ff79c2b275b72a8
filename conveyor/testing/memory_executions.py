"""Tenants, workflow versions, executions and node states in memory (part of
:class:`~conveyor.testing.InMemoryStore`): each method the SQL adapters' statement, a change
made only from the status it expects."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from conveyor.engine.queues import EXECUTION_QUEUE, NODE_QUEUE
from conveyor.engine.records import (
    Created,
    ExecutionOutcome,
    ExecutionRecord,
    Finish,
    FollowUp,
    NewJob,
    NodeRow,
    ParentLink,
    WorkflowRecord,
)
from conveyor.engine.states import (
    ACTIVE_EXECUTION,
    DEFAULT_TENANT,
    PAUSED_JOB,
    RUNNABLE_JOB,
    STOPPABLE_JOB,
    STOPPABLE_NODE,
    WAITING_JOB,
    AttemptStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    TriggerSource,
)
from conveyor.exceptions import ExecutionNotFound, StoreError, TenantNotFound, WorkflowNotFound
from conveyor.ids import new_id
from conveyor.testing.tables import ExecutionRow, JobRow, NodeStateRow, Tables, TenantRow, stored


class MemoryCore:
    """The tables every part of the in-memory store reads and writes."""

    def __init__(self, tables: Tables | None = None) -> None:
        self.tables = tables if tables is not None else Tables()

    def _execution_row(self, execution_id: uuid.UUID) -> ExecutionRow | None:
        return self.tables.executions.get(execution_id)

    def _set_execution(self, row: ExecutionRow, **values: Any) -> None:
        self.tables.executions[row.id] = replace(row, **values)

    def _set_job(self, row: JobRow, **values: Any) -> JobRow:
        changed = replace(row, **values)
        self.tables.jobs[row.id] = changed
        return changed

    def _add_job(
        self, execution: ExecutionRecord, job_id: uuid.UUID, now: datetime, **values: Any
    ) -> None:
        """A job of ``execution``, its row as the SQL stores insert it; refused, as the
        schema's keys refuse it, when the id is taken or the node has a job already."""
        node_id, index = values.get("node_id"), values.get("item_index")
        if job_id in self.tables.jobs or (
            node_id is not None
            and any(
                (j.execution_id, j.node_id, j.item_index) == (execution.id, node_id, index)
                for j in self.tables.jobs.values()
            )
        ):
            raise StoreError(
                f"job {job_id} (node {node_id!r}) breaks a key of jobs (its id, or "
                f"uq_jobs_execution_node: one job a node of an execution, one an item of a map)"
            )
        self.tables.jobs[job_id] = JobRow(
            id=job_id, priority=execution.priority, tenant_id=execution.tenant_id,
            workflow_id=execution.workflow_id, execution_id=execution.id, created_at=now,
            enqueued_at=now, **values,
        )  # fmt: skip

    def _add_node_job(self, execution: ExecutionRecord, job: NewJob, now: datetime) -> None:
        self._add_job(
            execution, job.id, now, kind=JobKind.NODE, queue=NODE_QUEUE,
            status=JobStatus.SCHEDULED if job.next_run_at else JobStatus.QUEUED,
            max_retries=job.max_retries, node_id=job.node_id, next_run_at=job.next_run_at,
        )  # fmt: skip

    def _add_start_job(self, execution: ExecutionRecord, job_id: uuid.UUID, now: datetime) -> None:
        later = execution.scheduled_for is not None and execution.scheduled_for > now
        self._add_job(
            execution, job_id, now, kind=JobKind.EXECUTION, queue=EXECUTION_QUEUE,
            status=JobStatus.SCHEDULED if later else JobStatus.QUEUED, max_retries=0,
            node_id=None, next_run_at=execution.scheduled_for if later else None,
        )  # fmt: skip


class MemoryCatalog(MemoryCore):
    """Tenants and workflow versions."""

    def create_tenant(self, name: str) -> uuid.UUID:
        """The tenant's id, the tenant made if it is new."""
        if (found := self._tenant_named(name)) is not None:
            return found.id
        tenant = TenantRow(id=new_id(), name=name)
        self.tables.tenants[tenant.id] = tenant
        return tenant.id

    def tenant_named(self, name: str) -> uuid.UUID | None:
        found = self._tenant_named(name)
        return None if found is None else found.id

    def tenant_id(self, name: str) -> uuid.UUID:
        if (found := self.tenant_named(name)) is not None:
            return found
        if name == DEFAULT_TENANT:
            return self.create_tenant(name)
        raise TenantNotFound(
            f"no tenant is named {name!r}; create it with `conveyor tenants create {name}`"
        )

    def trigger_target(self, tenant: str, workflow: str) -> tuple[uuid.UUID, uuid.UUID | None]:
        tenant_id = self.tenant_id(tenant)
        latest = self.latest_workflow(tenant_id, workflow)
        return tenant_id, latest.id if latest else None

    def workflow_version(
        self, tenant_id: uuid.UUID, name: str, version: int
    ) -> WorkflowRecord | None:
        return next(
            (w for w in self.tables.workflows.values()
             if (w.tenant_id, w.name, w.version) == (tenant_id, name, version)),
            None,
        )  # fmt: skip

    def workflow(self, workflow_id: uuid.UUID) -> WorkflowRecord:
        if (found := self.tables.workflows.get(workflow_id)) is None:
            raise WorkflowNotFound(f"no workflow version has id {workflow_id}")
        return found

    def lock_applies(self, tenant_id: uuid.UUID) -> None:
        """Nothing to take: one unit of work runs at a time."""

    def latest_workflow(self, tenant_id: uuid.UUID, name: str) -> WorkflowRecord | None:
        versions = [
            w for w in self.tables.workflows.values() if (w.tenant_id, w.name) == (tenant_id, name)
        ]
        return max(versions, key=lambda w: w.version, default=None)

    def latest_workflows(
        self, keys: Collection[tuple[uuid.UUID, str]]
    ) -> dict[tuple[uuid.UUID, str], WorkflowRecord]:
        found = {key: self.latest_workflow(*key) for key in keys}
        return {key: record for key, record in found.items() if record is not None}

    def add_workflow_version(
        self,
        tenant_id: uuid.UUID,
        name: str,
        digest: str,
        definition: dict[str, Any],
        now: datetime,
    ) -> WorkflowRecord:
        latest = self.latest_workflow(tenant_id, name)
        record = WorkflowRecord(
            id=new_id(), tenant_id=tenant_id, name=name,
            version=latest.version + 1 if latest else 1, digest=digest,
            definition=stored(definition), created_at=now,
        )  # fmt: skip
        self.tables.workflows[record.id] = record
        return record

    def _tenant_named(self, name: str) -> TenantRow | None:
        return next((t for t in self.tables.tenants.values() if t.name == name), None)


class MemoryExecutions(MemoryCatalog):
    """Executions: made by a trigger, started by a plan, settled node by node, finished."""

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
        if names is not None and not self._latest(execution, names):
            return Created.STALE
        if self._key_taken(execution.tenant_id, idempotency_key, dedupe_key) or (
            execution.parent is not None and self._child_of(execution.parent) is not None
        ):
            return Created.KEY_TAKEN
        planned, parent = waiting_on is not None, execution.parent
        self.tables.executions[execution.id] = ExecutionRow(
            id=execution.id, tenant_id=execution.tenant_id, workflow_id=execution.workflow_id,
            status=ExecutionStatus.RUNNING if planned else ExecutionStatus.PENDING,
            priority=execution.priority, trigger=trigger, input=stored(execution.input),
            remaining_nodes=len(waiting_on or {}), started_at=now if planned else None,
            created_at=now, idempotency_key=idempotency_key, dedupe_key=dedupe_key,
            traceparent=execution.trace.traceparent if execution.trace else None,
            tracestate=execution.trace.tracestate if execution.trace else None,
            scheduled_for=execution.scheduled_for,
            max_attempts=execution.limits.max_attempts if execution.limits else None,
            timeout=execution.limits.timeout if execution.limits else None,
            parent_execution_id=parent.execution_id if parent else None,
            parent_node_id=parent.node_id if parent else None,
            parent_job_id=parent.job_id if parent else None,
            parent_try=parent.try_number if parent else None, depth=execution.depth,
        )  # fmt: skip
        if waiting_on is not None:
            self.add_node_states(execution.id, waiting_on, queued)
        for job in jobs:
            self._add_node_job(execution, job, now)
        if start_job is not None:
            self._add_start_job(execution, start_job, now)
        return Created.CREATED

    def _latest(self, execution: ExecutionRecord, names: tuple[str, str]) -> bool:
        """Whether ``names`` (tenant, workflow) name the execution's version as the latest."""
        tenant = self._tenant_named(names[0])
        if tenant is None or tenant.id != execution.tenant_id:
            return False
        latest = self.latest_workflow(tenant.id, names[1])
        return latest is not None and latest.id == execution.workflow_id

    def _child_of(self, parent: ParentLink) -> ExecutionRow | None:
        """The child the parent's job started in that try (as uq_executions_parent_try)."""
        return next(
            (e for e in self.tables.executions.values()
             if (e.parent_job_id, e.parent_try) == (parent.job_id, parent.try_number)),
            None,
        )  # fmt: skip

    def _key_taken(self, tenant_id: uuid.UUID, idempotency: str | None, dedupe: str | None) -> bool:
        """As the unique indexes decide: an idempotency key once per tenant, a deduplication
        key once among the tenant's active executions."""
        mine = [e for e in self.tables.executions.values() if e.tenant_id == tenant_id]
        return any(
            (idempotency is not None and e.idempotency_key == idempotency)
            or (dedupe is not None and e.dedupe_key == dedupe and e.status in ACTIVE_EXECUTION)
            for e in mine
        )

    def execution(self, execution_id: uuid.UUID) -> ExecutionRecord:
        if (row := self._execution_row(execution_id)) is None:
            raise ExecutionNotFound(
                f"no execution has id {execution_id}; list them with `conveyor executions list`"
            )
        return row.record()

    def execution_status(
        self, execution_id: uuid.UUID, *, lock: bool = False
    ) -> ExecutionStatus | None:
        row = self._execution_row(execution_id)
        return row.status if row else None

    def execution_by_key(self, tenant_id: uuid.UUID, key: str) -> tuple[uuid.UUID, str] | None:
        return self._made_with(
            lambda e: e.tenant_id == tenant_id and e.idempotency_key == key
        )  # fmt: skip

    def active_by_dedupe(self, tenant_id: uuid.UUID, key: str) -> tuple[uuid.UUID, str] | None:
        return self._made_with(
            lambda e: (
                e.tenant_id == tenant_id and e.dedupe_key == key and e.status in ACTIVE_EXECUTION
            )
        )

    def _made_with(self, matches: Callable[[ExecutionRow], bool]) -> tuple[uuid.UUID, str] | None:
        found = next((e for e in self.tables.executions.values() if matches(e)), None)
        return (found.id, self.workflow(found.workflow_id).name) if found else None

    def replace_unstarted_input(self, execution_id: uuid.UUID, input: Any) -> bool:
        row = self._execution_row(execution_id)
        if row is None or row.status is not ExecutionStatus.PENDING:
            return False
        unstarted = {*RUNNABLE_JOB, *WAITING_JOB}
        if not any(
            j.execution_id == execution_id and j.kind is JobKind.EXECUTION
            and j.status in unstarted
            for j in self.tables.jobs.values()
        ):  # fmt: skip
            return False
        self._set_execution(row, input=stored(input))
        return True

    def leave_follow_up(self, execution_id: uuid.UUID, input: Any, now: datetime) -> bool:
        row = self._execution_row(execution_id)
        if row is None or row.status not in ACTIVE_EXECUTION:
            return False
        self._set_execution(row, follow_up=stored(FollowUp.stored(input, now)))
        return True

    def take_follow_up(self, execution_id: uuid.UUID) -> FollowUp | None:
        row = self._execution_row(execution_id)
        if row is None or row.follow_up is None:
            return None
        self._set_execution(row, follow_up=None)
        if row.dedupe_key is None:
            return None
        return FollowUp(
            tenant=self.tables.tenants[row.tenant_id].name,
            workflow=self.workflow(row.workflow_id).name,
            dedupe_key=row.dedupe_key, input=row.follow_up["input"], priority=row.priority,
            source=TriggerSource(row.trigger), left_at=FollowUp.left_at_of(row.follow_up),
        )  # fmt: skip

    def start_execution(self, execution_id: uuid.UUID, node_count: int, now: datetime) -> bool:
        row = self._execution_row(execution_id)
        if row is None or row.status is not ExecutionStatus.PENDING:
            return False
        self._set_execution(
            row, status=ExecutionStatus.RUNNING, started_at=now, remaining_nodes=node_count
        )
        return True

    def settle_nodes(
        self, execution_id: uuid.UUID, count: int, finish: Finish | None = None
    ) -> int | None:
        row = self._execution_row(execution_id)
        if row is None or row.status is not ExecutionStatus.RUNNING:
            return None
        left = row.remaining_nodes - count
        if finish is not None and row.remaining_nodes == count:
            self._set_execution(
                row, remaining_nodes=left, status=ExecutionStatus.COMPLETED,
                finished_at=finish.now, output=stored(finish.output),
            )  # fmt: skip
        else:
            self._set_execution(row, remaining_nodes=left)
        return left

    def finish_execution(
        self,
        execution_id: uuid.UUID,
        status: ExecutionStatus,
        now: datetime,
        *,
        output: Any = None,
        error: str | None = None,
    ) -> bool:
        row = self._execution_row(execution_id)
        if row is None or row.status not in ACTIVE_EXECUTION:
            return False
        self._set_execution(row, status=status, finished_at=now, output=stored(output), error=error)
        return True

    def cancel_unstarted(self, execution_id: uuid.UUID, now: datetime) -> list[uuid.UUID]:
        cancelled = self._cancel_jobs(lambda j: j.execution_id == execution_id, now)
        for node in self._nodes_of(execution_id):
            mapping = node.status is NodeStatus.RUNNING and node.items_total is not None
            if node.status in STOPPABLE_NODE or mapping:
                self._set_node(node, status=NodeStatus.CANCELLED, finished_at=now)
        return cancelled

    def _cancel_jobs(self, mine: Callable[[JobRow], bool], now: datetime) -> list[uuid.UUID]:
        """Cancel the jobs ``mine`` picks that have not started (those waiting for a child
        too, the try each waits in ended cancelled); the node jobs among them the limiter may
        know (not the held items)."""
        cancelled = [
            (j.status, self._set_job(j, status=JobStatus.CANCELLED, completed_at=now))
            for j in list(self.tables.jobs.values())
            if mine(j)
            and (
                j.status in STOPPABLE_JOB
                or (j.status is JobStatus.HELD and j.item_index is not None)  # a rerun's stays
            )
        ]
        for was, job in cancelled:
            if was in PAUSED_JOB:
                self._end_wait(job, now)
        return [
            j.id for was, j in cancelled if j.kind is JobKind.NODE and was is not JobStatus.HELD
        ]

    def _end_wait(self, job: JobRow, now: datetime) -> None:
        """The try a job cancelled while it waited for its child waits in: ended cancelled."""
        attempt = self.tables.attempts.get((job.id, job.try_number))
        if attempt is None or attempt.status is not AttemptStatus.RUNNING:
            return
        took = max(0.0, (now - attempt.started_at).total_seconds())
        self.tables.attempts[job.id, job.try_number] = replace(
            attempt, status=AttemptStatus.CANCELLED, finished_at=now, duration=took
        )

    # -- children -------------------------------------------------------------------------

    def execution_outcome(self, execution_id: uuid.UUID) -> ExecutionOutcome | None:
        if (row := self._execution_row(execution_id)) is None:
            return None
        dead = sorted(
            (j for j in self.tables.jobs.values()
             if j.execution_id == execution_id
             and j.status in (JobStatus.DEAD_LETTER, JobStatus.DISCARDED)),
            key=lambda j: (j.completed_at or row.created_at, j.id),
        )  # fmt: skip
        return ExecutionOutcome(
            status=row.status, output=row.output, error=row.error, created_at=row.created_at,
            dead_letter=(dead[0].id, dead[0].node_id or "") if dead else None,
        )  # fmt: skip

    def children_started(self, execution_id: uuid.UUID, most: int) -> int:
        found = sum(
            1 for e in self.tables.executions.values() if e.parent_execution_id == execution_id
        )
        return min(found, most)

    def active_children(
        self, execution_id: uuid.UUID, node_id: str | None = None
    ) -> list[uuid.UUID]:
        found = (
            e for e in self.tables.executions.values()
            if e.parent_execution_id == execution_id and e.status in ACTIVE_EXECUTION
            and node_id in (None, e.parent_node_id)
        )  # fmt: skip
        return [e.id for e in sorted(found, key=lambda e: (e.created_at, e.id))]

    def orphaned_children(self, limit: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
        found = []
        for child in self.tables.executions.values():
            if child.parent_execution_id is None or child.status not in ACTIVE_EXECUTION:
                continue
            job = self.tables.jobs.get(child.parent_job_id) if child.parent_job_id else None
            waits = (
                job is not None
                and job.status is JobStatus.WAITING_CHILD
                and job.try_number == child.parent_try
            )
            if not waits:
                found.append(child)
        found.sort(key=lambda e: (e.created_at, e.id))
        return [(e.id, e.parent_execution_id) for e in found[:limit] if e.parent_execution_id]

    def children_to_settle(self, limit: int) -> list[uuid.UUID]:
        found = []
        for child in self.tables.executions.values():
            job = self.tables.jobs.get(child.parent_job_id) if child.parent_job_id else None
            if (
                job is not None
                and job.status is JobStatus.WAITING_CHILD
                and job.try_number == child.parent_try
                and child.status.finished
            ):
                found.append(child)
        found.sort(key=lambda e: (e.finished_at or e.created_at, e.id))
        return [e.id for e in found[:limit]]

    # -- node states ----------------------------------------------------------------------

    def add_node_states(
        self,
        execution_id: uuid.UUID,
        waiting_on: Mapping[str, int],
        queued: Collection[str] = (),
    ) -> None:
        if taken := [n for n in waiting_on if (execution_id, n) in self.tables.node_states]:
            raise StoreError(f"execution {execution_id} has states for nodes {taken} already")
        for node_id, count in waiting_on.items():
            status = NodeStatus.QUEUED if node_id in queued else NodeStatus.PENDING
            self.tables.node_states[execution_id, node_id] = NodeStateRow(
                execution_id=execution_id, node_id=node_id, status=status, waiting_on=count
            )

    def set_node(
        self, execution_id: uuid.UUID, node_id: str, status: NodeStatus, **values: Any
    ) -> None:
        if (node := self.tables.node_states.get((execution_id, node_id))) is None:
            return  # as an UPDATE that finds no row
        if "output" in values:
            values["output"] = stored(values["output"])
        self._set_node(node, status=status, **values)

    def start_node(self, execution_id: uuid.UUID, node_id: str, now: datetime) -> None:
        if (node := self.tables.node_states.get((execution_id, node_id))) is not None:
            self._set_node(node, status=NodeStatus.RUNNING, started_at=node.started_at or now)

    def decrement_waiting(self, execution_id: uuid.UUID, node_ids: Sequence[str]) -> dict[str, int]:
        left: dict[str, int] = {}
        for node_id in dict.fromkeys(node_ids):  # a node named twice counts once, as in SQL
            if (node := self.tables.node_states.get((execution_id, node_id))) is not None:
                self._set_node(node, waiting_on=node.waiting_on - 1)
                left[node_id] = node.waiting_on - 1
        # (the rows found are changed first, as the UPDATE did: the caller's unit rolls back)
        if missing := set(node_ids) - set(left):
            raise StoreError(f"nodes {sorted(missing)} have no state in execution {execution_id}")
        return left

    def queue_nodes(self, execution_id: uuid.UUID, node_ids: Sequence[str]) -> None:
        for node_id in node_ids:
            node = self.tables.node_states.get((execution_id, node_id))
            if node is not None and node.status is NodeStatus.PENDING:
                self._set_node(node, status=NodeStatus.QUEUED)

    def node_rows(
        self, execution_id: uuid.UUID, node_ids: Iterable[str], *, outputs: bool = True
    ) -> dict[str, NodeRow]:
        found = (self.tables.node_states.get((execution_id, n)) for n in node_ids)
        return {node.node_id: node.row(outputs=outputs) for node in found if node is not None}

    def _nodes_of(self, execution_id: uuid.UUID) -> list[NodeStateRow]:
        return [n for n in self.tables.node_states.values() if n.execution_id == execution_id]

    def _set_node(self, node: NodeStateRow, **values: Any) -> None:
        self.tables.node_states[node.execution_id, node.node_id] = replace(node, **values)
