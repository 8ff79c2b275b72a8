"""Nodes that became ready: their jobs (a delay node's held until its time), their states
queued, the context their templates see, and the messages that publish them."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from conveyor.engine import node_types, planning, trigger_limits
from conveyor.engine.definitions import Node, Workflow
from conveyor.engine.ports import Store
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import (
    Dispatch,
    ExecutionRecord,
    JobRecord,
    Limits,
    NewJob,
    NodeHints,
)
from conveyor.engine.states import (
    JobKind,
)
from conveyor.exceptions import (
    ConveyorError,
    TemplateBudgetExceeded,
)
from conveyor.ids import new_id


def context_of(execution: ExecutionRecord, outputs: dict[str, Any]) -> dict[str, Any]:
    """What a node's templates see: the execution and its needs' outputs."""
    return planning.template_context(
        execution_id=str(execution.id),
        workflow_input=execution.input,
        outputs=outputs,
        scheduled_for=execution.scheduled_for,
    )


def enqueue_ready(
    store: Store, execution: ExecutionRecord, workflow: Workflow, node: Node, now: datetime
) -> Dispatch | None:
    """Enqueue a node whose needs have all settled, with their outputs in its context."""
    rows = store.node_rows(execution.id, node.needs)
    context = context_of(execution, {need: row.output for need, row in rows.items()})
    found = enqueue_nodes(store, execution, workflow, [(node, context)], now)
    return found[0] if found else None  # none: a delay node's job waits for its time


def enqueue_nodes(
    store: Store,
    execution: ExecutionRecord,
    workflow: Workflow,
    ready: list[tuple[Node, dict[str, Any]]],
    now: datetime,
    state_queued: bool = False,
) -> list[Dispatch]:
    """Jobs for nodes ready to run (one INSERT), their states queued (one UPDATE); the
    messages to publish (a delay node's job waits in the database for the promoter). In an
    execution that was re-run, a node whose job a rerun held takes that job instead (one job
    a node: its tries numbered on)."""
    if not ready:
        return []
    jobs = new_jobs(workflow, ready, now, limits=execution.limits)
    fresh = jobs
    if execution.reruns:
        held = store.take_held_jobs(execution, jobs, now)
        fresh = [j for j in jobs if j.node_id not in held]
        jobs = [replace(j, id=held[j.node_id]) if j.node_id in held else j for j in jobs]
    if fresh:
        store.add_node_jobs(execution, fresh, now)
    if not state_queued:
        store.queue_nodes(execution.id, [j.node_id for j in jobs])
    return node_dispatches(execution, workflow.name, jobs, now)


def new_jobs(
    workflow: Workflow,
    ready: list[tuple[Node, dict[str, Any]]],
    now: datetime,
    *,
    refuse: bool = False,
    limits: Limits | None = None,
) -> list[NewJob]:
    """A job per node ready to run; a delay node's is held until its time. With ``refuse``,
    a delay template over its budget is raised (a trigger's 422, nothing stored)."""
    jobs: list[NewJob] = []
    for node, context in ready:
        next_run_at = None
        if node_types.waits(node):
            try:
                next_run_at = now + timedelta(seconds=planning.delay_seconds(node, context, now))
            except TemplateBudgetExceeded:
                if refuse:
                    raise
            except ConveyorError:
                next_run_at = None  # the node runs now and fails with the same error, recorded
        jobs.append(
            NewJob(
                id=new_id(),
                node_id=node.id,
                max_retries=trigger_limits.retry_policy(workflow, node, limits).max_attempts - 1,
                next_run_at=next_run_at,
            )
        )
    return jobs


def node_dispatches(
    execution: ExecutionRecord, workflow: str, jobs: list[NewJob], now: datetime
) -> list[Dispatch]:
    """The messages of new node jobs (not of those held until later)."""
    return [
        Dispatch(
            job_id=j.id,
            kind=JobKind.NODE,
            queue=NODE_QUEUE,
            priority=execution.priority,
            label=f"execution={execution.id}",
            workflow=workflow,
            node=j.node_id,
            hints=NodeHints(
                tenant_id=execution.tenant_id,
                workflow_id=execution.workflow_id,
                priority=execution.priority,
                enqueued_at=now,
                node_id=j.node_id,
                workflow=workflow,
            ),
        )
        for j in jobs
        if j.next_run_at is None
    ]


def dispatch_of(job: JobRecord, workflow: str = "") -> Dispatch:
    """The message that publishes a job, named for its workflow (``workflow``, else the name
    the store returned with the job) and node. No definition is loaded: the statements that
    hand out jobs to publish (promote, age, the recovery sweep) return the name with them."""
    workflow = workflow or job.workflow
    hints = None
    if job.kind is JobKind.NODE and job.enqueued_at is not None:
        hints = NodeHints(
            tenant_id=job.tenant_id,
            workflow_id=job.workflow_id,
            priority=job.priority,
            enqueued_at=job.enqueued_at,
            node_id=job.node_id,
            workflow=workflow,
        )
    return Dispatch(
        job_id=job.id, kind=job.kind, queue=job.queue, priority=job.priority,
        label=f"execution={job.execution_id}", workflow=workflow, node=job.node_id or "",
        hints=hints,
    )  # fmt: skip
