"""A node's successful try recorded, with the successors it makes ready."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.engine import node_types
from conveyor.engine.claiming import NodeRun
from conveyor.engine.definitions import DedupePolicy
from conveyor.engine.ports import Store
from conveyor.engine.records import (
    Dispatch,
)
from conveyor.engine.settling import known_finish, outcome_status, settle
from conveyor.engine.states import (
    AttemptStatus,
    JobStatus,
    NodeStatus,
)
from conveyor.engine.workflows import load_workflow


def complete_alone(store: Store, run: NodeRun, output: Any, now: datetime, duration: float) -> bool:
    """Record a successful try in one statement, for the caller to run alone (no
    transaction round trips), in the common cases where the database can: the node makes no
    successor ready (each still waits on another node), and, if nothing waits on it, the
    execution's output is its own output's to make should it be the last. False when the
    case is another (a successor becomes ready, an output to read, the execution or the job
    no longer running): nothing was changed, and :func:`complete_node` does it."""
    _, shape = load_workflow(store, run.execution.workflow_id)
    successors = shape.successors[run.node.id]
    finish = None
    if not successors:
        finish = known_finish(run, shape, now, {run.node.id: output})
        if finish is None:
            return False  # it may be the last: the execution's output must be read
        if run.workflow.dedupe.policy is not DedupePolicy.KEEP_FIRST:
            return False  # it may be the last: a follow-up left on it is to start
        if run.execution.parent is not None:
            return False  # it may be the last: its parent's node is to settle
    branch = output.get("branch") if node_types.branches(run.node) else None
    return store.complete_running(
        run.job, run.node.id, output=output, branch=branch, now=now, duration=duration,
        successors=sorted(successors), finish=finish,
    )  # fmt: skip


def complete_node(
    store: Store, run: NodeRun, output: Any, now: datetime, duration: float
) -> list[Dispatch]:
    """Record a successful try and start every successor that became ready."""
    job, execution_id, node_id = run.job, run.execution.id, run.node.id
    branch = output.get("branch") if node_types.branches(run.node) else None
    if store.complete_running(
        job, node_id, output=output, branch=branch, now=now, duration=duration
    ):  # the common case, in one statement where the database can
        return settle(store, run, now, output)
    status = outcome_status(store, execution_id)
    cancelled = status is not None and status.finished
    # A node that returns after its execution was cancelled (or failed elsewhere) keeps its
    # output for inspection but is recorded as cancelled: it may have stopped on ctx.cancelled.
    job_status, node_status = (
        (JobStatus.CANCELLED, NodeStatus.CANCELLED)
        if cancelled
        else (JobStatus.COMPLETED, NodeStatus.COMPLETED)
    )
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, job_status, try_number=job.try_number, completed_at=now,
        last_error=None,
    ):  # fmt: skip
        return []  # reclaimed meanwhile
    store.finish_attempt(job.id, job.try_number, AttemptStatus.SUCCEEDED, now, duration)
    store.set_node(
        execution_id,
        node_id,
        node_status,
        output=output,
        branch=branch,
        finished_at=now,
        error=f"execution {status.value} while the node ran" if cancelled and status else None,
    )
    if cancelled:
        return []
    return settle(store, run, now, output)
