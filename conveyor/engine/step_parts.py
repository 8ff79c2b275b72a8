"""A chain's step (:meth:`~conveyor.engine.ports.Jobs.complete_step`) as the port's own
transitions in turn, for an adapter that runs it so: SQLite's, in its one writer's
transaction, and the in-memory store's. PostgreSQL runs it as one statement
(:data:`~conveyor.store.postgres_statements.COMPLETE_STEP`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.engine.ports import Store
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import ExecutionRecord, JobRecord, NewJob, Stepped
from conveyor.engine.states import ExecutionStatus, NodeStatus
from conveyor.exceptions import StoreError


def complete_step(
    store: Store,
    job: JobRecord,
    node_id: str,
    *,
    output: Any,
    branch: str | None,
    now: datetime,
    duration: float,
    execution: ExecutionRecord,
    successor: NewJob,
    worker: str | None,
    claim: bool,
) -> Stepped | None:
    """See the port. The successor's state is checked first, so that None changes nothing:
    pending, it waits on this node alone (its one need), which settles only by this success
    (the job's try guards it)."""
    execution_id, next_node = job.execution_id, successor.node_id
    state = store.node_rows(execution_id, [next_node], outputs=False).get(next_node)
    if state is None or state.status is not NodeStatus.PENDING:
        return None
    if store.execution_status(execution_id) is not ExecutionStatus.RUNNING:
        return None
    if not store.complete_running(
        job, node_id, output=output, branch=branch, now=now, duration=duration
    ):
        return None
    if store.decrement_waiting(execution_id, [next_node])[next_node] != 0:
        # (the caller's unit rolls back: a state the engine never leaves)
        raise StoreError(f"node {next_node!r} of execution {execution_id} waits on another node")
    store.add_node_jobs(execution, [successor], now)
    store.queue_nodes(execution_id, [next_node])
    store.settle_nodes(execution_id, 1)
    if not claim:
        return Stepped()
    claimed = store.claim_continuation(
        successor.id, now, worker, queue=NODE_QUEUE, priority=execution.priority, needs=[node_id]
    )
    return Stepped(claimed=claimed)
