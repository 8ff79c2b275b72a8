"""Operator repairs of dead-lettered node jobs: one transaction each, like every transition
of the engine; the caller publishes the returned dispatches after commit.

Requeue resumes the failed execution from the dead node: the execution runs again, the dead
job and every node job the failure stopped are queued with a fresh set of tries (their
earlier tries stay in the history), nodes that were waiting wait again, and the execution's
counters are recounted from its nodes' states (a node that finished as the failure committed
was never counted). Completed nodes keep their outputs; a node the failure cancelled runs
again, even if it had run to its end (it may have stopped early on ``ctx.cancelled``), which
is why node authors key side effects with ``ctx.idempotency_key``.

A requeue for later (``run_at``, a time :func:`conveyor.engine.later.start_time` made) holds
the jobs it would queue in the database, ``scheduled`` until then, as a delay node's job
waits; the execution runs meanwhile and can be cancelled.

Discard moves the dead letter to the archive (status ``discarded``): nothing is ever deleted.

A child execution's dead letter is not requeued: the child's failure settled its parent's
workflow node in the same transaction (a retry starts a new child, or the node failed), so
resuming the child would run it for no one; the parent's dead letter is requeued instead.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from conveyor.engine import planning
from conveyor.engine.ports import Store
from conveyor.engine.ready import dispatch_of, enqueue_ready
from conveyor.engine.records import Dispatch, JobRecord
from conveyor.engine.states import JobStatus, NodeStatus
from conveyor.engine.workflows import load_workflow
from conveyor.exceptions import InvalidTransition, NotFound


def requeue(
    store: Store,
    job_id: uuid.UUID,
    tenant_id: uuid.UUID | None,
    now: datetime,
    run_at: datetime | None = None,
) -> list[Dispatch]:
    """Resume the dead letter's execution from it (at ``run_at`` when given); the jobs to
    publish."""
    job = _dead(store, job_id, tenant_id)
    workflow, _ = load_workflow(store, job.workflow_id)
    assert job.node_id is not None
    if workflow.node(job.node_id).continue_on_failure:
        raise InvalidTransition(
            f"dead letter {job_id}: its execution went on without node {job.node_id!r} "
            f"(continue_on_failure), so it cannot resume from it; trigger a new execution"
        )
    if job.item_index is not None:
        raise InvalidTransition(
            f"dead letter {job_id} is item {job.item_index} of map node {job.node_id!r}; a "
            f"requeue does not resume a map: rerun the execution from that node (`conveyor "
            f"executions rerun {job.execution_id} --from {job.node_id}`), which runs its items "
            f"again, or discard it"
        )
    if (parent := store.execution(job.execution_id).parent) is not None:
        raise InvalidTransition(
            f"dead letter {job_id}: its execution is a child of execution "
            f"{parent.execution_id}, whose node {parent.node_id!r} went on when the child "
            f"failed (it retried with a new child, or failed); requeue the parent's dead "
            f"letter instead, which starts a new child"
        )
    if store.has_discarded(job.execution_id):
        raise InvalidTransition(
            f"dead letter {job_id}: another dead letter of its execution was discarded, so "
            f"it cannot complete; trigger a new execution"
        )
    if not store.revive_execution(job.execution_id):  # locks the execution row
        status = store.execution(job.execution_id).status
        raise InvalidTransition(
            f"dead letter {job_id}: its execution is {status.value}; only a failed execution "
            f"resumes from its dead letter (discard this one instead)"
        )
    node_ids = [n.id for n in workflow.nodes]
    before = store.node_rows(job.execution_id, node_ids)
    keep = {  # failed, tolerated, and settled long ago: they stay as they are
        n.id
        for n in workflow.nodes
        if n.continue_on_failure and before[n.id].status is NodeStatus.FAILED
    }
    stopped = [
        n for n, r in before.items()
        if r.items_total is not None and r.status in _STOPPED and n not in keep
    ]  # fmt: skip
    if stopped:  # (raising rolls the revival back)
        raise InvalidTransition(
            f"dead letter {job_id}: its execution stopped at map node {stopped[0]!r}, which "
            f"had made its items, and a requeue does not resume a map: rerun the execution "
            f"from that node instead (`conveyor executions rerun {job.execution_id} --from "
            f"{stopped[0]}`)"
        )
    revived = store.revive_jobs(job.execution_id, now, keep)
    store.revive_nodes(job.execution_id, {j.node_id for j in revived if j.node_id}, keep)
    rows = store.node_rows(job.execution_id, node_ids)
    resumed = planning.resume(
        workflow, {i: planning.NeedState(status=r.status, branch=r.branch) for i, r in rows.items()}
    )
    for node_id in resumed.skip:
        store.set_node(job.execution_id, node_id, NodeStatus.SKIPPED, finished_at=now)
    store.recount(job.execution_id, resumed.waiting_on, resumed.remaining)
    execution = store.execution(job.execution_id)
    started = [enqueue_ready(store, execution, workflow, workflow.node(n), now)
               for n in resumed.enqueue]  # fmt: skip
    dispatches = [
        dispatch_of(j, workflow.name) for j in revived if j.status is JobStatus.QUEUED
    ] + [d for d in started if d is not None]
    if run_at is None or run_at <= now:
        return dispatches
    for dispatch in dispatches:  # queued just now, unpublished: they wait for run_at instead
        store.transition_job(
            dispatch.job_id, JobStatus.QUEUED, JobStatus.SCHEDULED, next_run_at=run_at
        )
    return []


# A map node in one of these has items it never ran: its counter would not match a revival.
_STOPPED = (NodeStatus.FAILED, NodeStatus.CANCELLED)


def discard(store: Store, job_id: uuid.UUID, tenant_id: uuid.UUID | None, now: datetime) -> None:
    """Move a dead letter to the archive; its execution stays failed."""
    job = _dead(store, job_id, tenant_id)
    store.discard_dead_letter(job.id, now)


def _dead(store: Store, job_id: uuid.UUID, tenant_id: uuid.UUID | None) -> JobRecord:
    job = store.dead_letter(job_id, tenant_id)
    if job is None:
        raise NotFound(
            f"no dead letter has id {job_id}; list them with `conveyor dlq list` (a requeued "
            f"one is not a dead letter any more)"
        )
    if job.status is JobStatus.DISCARDED:
        raise InvalidTransition(f"dead letter {job_id} was discarded; it stays in the archive")
    return job
