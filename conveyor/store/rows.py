"""ORM rows to the frozen records the engine reads (:mod:`conveyor.engine.records`)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Row

from conveyor.engine.records import (
    EndpointRecord,
    ExecutionRecord,
    JobRecord,
    Limits,
    ParentLink,
    ScheduleRecord,
    TraceContext,
    WorkflowRecord,
)
from conveyor.models import Execution, Job, Schedule, WebhookEndpoint, WorkflowVersion


def job_record(row: Job | Row[Any], workflow: str = "") -> JobRecord:
    """``workflow``: the job's workflow name, where the statement read it."""
    return JobRecord(
        id=row.id,
        kind=row.kind,
        queue=row.queue,
        status=row.status,
        priority=row.priority,
        max_retries=row.max_retries,
        retry_count=row.retry_count,
        tries_before=row.tries_before,
        enqueued_at=row.enqueued_at,
        tenant_id=row.tenant_id,
        workflow_id=row.workflow_id,
        execution_id=row.execution_id,
        node_id=row.node_id,
        workflow=workflow,
        item_index=row.item_index,
        item=row.item,
    )


def execution_record(row: Execution | Row[Any]) -> ExecutionRecord:
    return ExecutionRecord(
        id=row.id,
        tenant_id=row.tenant_id,
        workflow_id=row.workflow_id,
        status=row.status,
        priority=row.priority,
        input=row.input,
        created_at=row.created_at,
        scheduled_for=row.scheduled_for,
        trace=trace_context(row.traceparent, row.tracestate),
        limits=Limits.of(row.max_attempts, row.timeout),
        reruns=row.reruns,
        parent=parent_link(row.parent_execution_id, row.parent_node_id, row.parent_job_id,
                           row.parent_try),
        depth=row.depth,
    )  # fmt: skip


def parent_link(
    execution_id: uuid.UUID | None,
    node_id: str | None,
    job_id: uuid.UUID | None,
    try_number: int | None,
) -> ParentLink | None:
    """A child's stored parent columns as its record carries them (None: not a child)."""
    if execution_id is None or node_id is None or job_id is None or try_number is None:
        return None
    return ParentLink(execution_id=execution_id, node_id=node_id, job_id=job_id,
                      try_number=try_number)  # fmt: skip


def trace_context(traceparent: str | None, tracestate: str | None) -> TraceContext | None:
    """An execution's stored trace context (None when it has none)."""
    return TraceContext(traceparent=traceparent, tracestate=tracestate) if traceparent else None


def workflow_record(row: WorkflowVersion | Row[Any]) -> WorkflowRecord:
    return WorkflowRecord(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        version=row.version,
        digest=row.digest,
        definition=row.definition,
        created_at=row.created_at,
    )


def schedule_record(row: Schedule) -> ScheduleRecord:
    return ScheduleRecord(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        workflow_name=row.workflow_name,
        origin=row.origin,
        cron=row.cron,
        timezone=row.timezone,
        input=row.input,
        priority=row.priority,
        misfire=row.misfire,
        catch_up=row.catch_up,
        enabled=row.enabled,
        next_run_at=row.next_run_at,
        last_run_at=row.last_run_at,
        run_count=row.run_count,
    )


def endpoint_record(row: WebhookEndpoint) -> EndpointRecord:
    return EndpointRecord(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        scheme=row.scheme,
        secret=row.secret,
        rejected=row.rejected,
        wakes_event=row.wakes_event,
        wakes_key=row.wakes_key,
    )
