"""A chain's step (:meth:`~conveyor.engine.ports.Jobs.complete_step`) as the port's own
transitions in turn, for an adapter that runs it so: SQLite's, in its one writer's
transaction, and the in-memory store's. PostgreSQL runs it as one statement
(:data:`~conveyor.store.postgres_statements.COMPLETE_STEP`)."""

from __future__ import annotations

from conveyor.engine.ports import Store
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import NewJob, Stepped, Succeeded
from conveyor.engine.states import ExecutionStatus, NodeStatus
from conveyor.exceptions import StoreError


def complete_step(
    store: Store, succeeded: Succeeded, successor: NewJob, *, worker: str | None, claim: bool
) -> Stepped | None:
    """See the port. The successor's state is checked first, so that None changes nothing:
    pending, it waits on this node alone (its one need), which settles only by this success
    (the job's try guards it)."""
    job, execution = succeeded.job, succeeded.execution
    execution_id, next_node = job.execution_id, successor.node_id
    state = store.node_rows(execution_id, [next_node], outputs=False).get(next_node)
    if state is None or state.status is not NodeStatus.PENDING:
        return None
    if store.execution_status(execution_id) is not ExecutionStatus.RUNNING:
        return None
    now = succeeded.now
    if not store.complete_running(
        job, succeeded.node_id, output=succeeded.output, branch=succeeded.branch, now=now,
        duration=succeeded.duration,
    ):  # fmt: skip
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
        successor.id,
        now,
        worker,
        queue=NODE_QUEUE,
        priority=execution.priority,
        needs=[succeeded.node_id],
    )
    return Stepped(claimed=claimed)
