"""The in-memory store's tables: a dict of frozen rows each, keyed as the SQL tables' unique
keys are. A change replaces a row; nothing is mutated in place, so a copy of the dicts is a
snapshot that a failed unit of work is rolled back to. Each row has the fields of its SQL
table's columns (of those the engine reads or writes), under the same names, so that a test
reads a row of either kind alike."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from conveyor.engine.records import (
    EndpointRecord,
    EventRecord,
    ExecutionRecord,
    JobRecord,
    Limits,
    NodeRow,
    ParentLink,
    ScheduleRecord,
    TraceContext,
    WaitRecord,
    WorkflowRecord,
)
from conveyor.engine.states import (
    AttemptStatus,
    DeliveryStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
    SubscriptionKind,
)


def stored(value: Any) -> Any:
    """A JSON column's value as the database gives it back: a copy that shares nothing with
    the caller's, tuples as lists, keys as strings (and a TypeError or ValueError for what
    no JSON column holds)."""
    return json.loads(json.dumps(value, allow_nan=False))


def trace_of(traceparent: str | None, tracestate: str | None) -> TraceContext | None:
    """A row's trace context columns as the record carries them (as conveyor.store.rows)."""
    return TraceContext(traceparent=traceparent, tracestate=tracestate) if traceparent else None


@dataclass(frozen=True, kw_only=True)
class TenantRow:
    id: uuid.UUID
    name: str
    max_concurrency: int | None = None


@dataclass(frozen=True, kw_only=True)
class ExecutionRow:
    """A row of ``executions``."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    workflow_id: uuid.UUID
    status: ExecutionStatus
    priority: Priority
    trigger: str
    input: Any
    output: Any = None
    error: str | None = None
    remaining_nodes: int = 0
    schedule_id: uuid.UUID | None = None
    scheduled_for: datetime | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    idempotency_key: str | None = None
    dedupe_key: str | None = None
    follow_up: Any = None
    reruns: int = 0
    parent_execution_id: uuid.UUID | None = None
    parent_node_id: str | None = None
    parent_job_id: uuid.UUID | None = None
    parent_try: int | None = None
    depth: int = 0
    traceparent: str | None = None
    tracestate: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def record(self) -> ExecutionRecord:
        return ExecutionRecord(
            id=self.id, tenant_id=self.tenant_id, workflow_id=self.workflow_id,
            status=self.status, priority=self.priority, input=self.input,
            created_at=self.created_at, scheduled_for=self.scheduled_for,
            trace=trace_of(self.traceparent, self.tracestate),
            limits=Limits.of(self.max_attempts, self.timeout), reruns=self.reruns,
            parent=self.parent, depth=self.depth,
        )  # fmt: skip

    @property
    def parent(self) -> ParentLink | None:
        if (
            self.parent_execution_id is None
            or self.parent_node_id is None
            or self.parent_job_id is None
            or self.parent_try is None
        ):
            return None
        return ParentLink(
            execution_id=self.parent_execution_id, node_id=self.parent_node_id,
            job_id=self.parent_job_id, try_number=self.parent_try,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class NodeStateRow:
    """A row of ``node_states``."""

    execution_id: uuid.UUID
    node_id: str
    status: NodeStatus
    waiting_on: int
    branch: str | None = None
    output: Any = None
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    items_total: int | None = None  # a map node's counter (None: not a map, or not yet)
    items_left: int | None = None
    items_failed: int | None = None

    def row(self, *, outputs: bool = True) -> NodeRow:
        if not outputs:  # as a readiness read has it: status and branch only
            return NodeRow(node_id=self.node_id, status=self.status, branch=self.branch)
        return NodeRow(
            node_id=self.node_id, status=self.status, branch=self.branch, output=self.output,
            error=self.error, items_total=self.items_total,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class JobRow:
    """A row of ``jobs``."""

    id: uuid.UUID
    kind: JobKind
    queue: str
    status: JobStatus
    priority: Priority
    max_retries: int
    retry_count: int = 0
    tries_before: int = 0
    tenant_id: uuid.UUID
    workflow_id: uuid.UUID
    execution_id: uuid.UUID
    node_id: str | None
    next_run_at: datetime | None = None
    last_error: str | None = None
    created_at: datetime
    enqueued_at: datetime
    processed_at: datetime | None = None
    heartbeat_at: datetime | None = None
    completed_at: datetime | None = None
    item_index: int | None = None  # a map's item: its index, value and output
    item: Any = None
    output: Any = None
    data: Any = field(default_factory=dict)  # a map's item: the held item it releases

    @property
    def try_number(self) -> int:
        return self.tries_before + self.retry_count + 1

    def record(self) -> JobRecord:
        return JobRecord(
            id=self.id, kind=self.kind, queue=self.queue, status=self.status,
            priority=self.priority, max_retries=self.max_retries, retry_count=self.retry_count,
            tries_before=self.tries_before, enqueued_at=self.enqueued_at,
            tenant_id=self.tenant_id, workflow_id=self.workflow_id,
            execution_id=self.execution_id, node_id=self.node_id,
            item_index=self.item_index, item=self.item,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class AttemptRow:
    """A row of ``job_attempts``: one try of a job."""

    job_id: uuid.UUID
    attempt_number: int
    status: AttemptStatus
    error: str | None = None
    traceback: str | None = None
    worker: str | None = None
    started_at: datetime
    finished_at: datetime | None = None
    duration: float | None = None
    waited: float | None = None
    timed_out: bool = False
    queue: str | None = None  # the job's, as the claim copies them
    workflow_id: uuid.UUID | None = None


@dataclass(frozen=True, kw_only=True)
class RerunRow:
    """A row of ``execution_reruns``."""

    id: int
    execution_id: uuid.UUID
    from_node: str
    input: Any
    requested_by: str
    requested_at: datetime


@dataclass(frozen=True, kw_only=True)
class DeliveryRow:
    """A row of ``webhook_deliveries``."""

    id: uuid.UUID
    endpoint_id: uuid.UUID
    tenant_id: uuid.UUID
    delivery_id: str
    event: str | None
    payload: Any
    status: DeliveryStatus
    executions: int = 0
    execution_ids: list[str] | None = None  # as the JSON column gives them back
    received_at: datetime
    processed_at: datetime | None = None
    traceparent: str | None = None
    tracestate: str | None = None

    @property
    def trace(self) -> TraceContext | None:
        return trace_of(self.traceparent, self.tracestate)


@dataclass(frozen=True, kw_only=True)
class SubscriptionRow:
    """A row of ``subscriptions``."""

    tenant_id: uuid.UUID
    workflow_name: str
    kind: SubscriptionKind
    source: str
    events: tuple[str, ...]


@dataclass(kw_only=True)
class Tables:
    """Every table of the in-memory store, keyed by its unique key."""

    tenants: dict[uuid.UUID, TenantRow] = field(default_factory=dict)
    workflows: dict[uuid.UUID, WorkflowRecord] = field(default_factory=dict)
    executions: dict[uuid.UUID, ExecutionRow] = field(default_factory=dict)
    node_states: dict[tuple[uuid.UUID, str], NodeStateRow] = field(default_factory=dict)
    jobs: dict[uuid.UUID, JobRow] = field(default_factory=dict)
    attempts: dict[tuple[uuid.UUID, int], AttemptRow] = field(default_factory=dict)
    reruns: dict[int, RerunRow] = field(default_factory=dict)
    schedules: dict[uuid.UUID, ScheduleRecord] = field(default_factory=dict)
    endpoints: dict[uuid.UUID, EndpointRecord] = field(default_factory=dict)
    deliveries: dict[uuid.UUID, DeliveryRow] = field(default_factory=dict)
    signatures: dict[tuple[uuid.UUID, str], datetime] = field(default_factory=dict)
    subscriptions: dict[tuple[uuid.UUID, str], tuple[SubscriptionRow, ...]] = field(
        default_factory=dict
    )
    events: dict[uuid.UUID, EventRecord] = field(default_factory=dict)
    waits: dict[uuid.UUID, WaitRecord] = field(default_factory=dict)  # by job id

    def copy(self) -> Tables:
        """A snapshot: the rows are frozen, so copying the dicts is enough."""
        return Tables(**{f.name: dict(getattr(self, f.name)) for f in fields(self)})

    def restore(self, snapshot: Tables) -> None:
        """Back to ``snapshot``, in place (the stores handed out hold these tables)."""
        for f in fields(self):
            setattr(self, f.name, dict(getattr(snapshot, f.name)))
