"""Operator repairs of dead-lettered node jobs: one transaction each, like
:mod:`conveyor.engine.runner`; the caller publishes the returned dispatches after commit.

Requeue resumes the failed execution from the dead node: the execution runs again, the dead
job and every node job the failure cancelled are queued with a fresh set of tries (their
earlier tries stay in the history), and nodes that were waiting wait again. Nodes that had
finished keep their outputs. Discard moves the dead letter to the archive (status
``discarded``): nothing is ever deleted.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING

from conveyor.engine.records import Dispatch, JobRecord
from conveyor.engine.runner import dispatch_of, load_workflow
from conveyor.engine.states import JobStatus
from conveyor.exceptions import InvalidTransition, NotFound

if TYPE_CHECKING:
    from conveyor.store.sql import SqlStore


def requeue(
    store: SqlStore, job_id: uuid.UUID, tenant_id: uuid.UUID | None, now: datetime
) -> list[Dispatch]:
    """Resume the dead letter's execution from it; the jobs to publish."""
    job = _dead(store, job_id, tenant_id)
    workflow, _ = load_workflow(store, job.workflow_id)
    assert job.node_id is not None
    if workflow.node(job.node_id).continue_on_failure:
        raise InvalidTransition(
            f"dead letter {job_id}: its execution went on without node {job.node_id!r} "
            f"(continue_on_failure), so it cannot resume from it; trigger a new execution"
        )
    if not store.revive_execution(job.execution_id):
        status = store.execution(job.execution_id).status
        raise InvalidTransition(
            f"dead letter {job_id}: its execution is {status.value}; only a failed execution "
            f"resumes from its dead letter (discard this one instead)"
        )
    tolerated = {n.id for n in workflow.nodes if n.continue_on_failure}
    revived = store.revive_jobs(job.execution_id, now, keep=tolerated)
    store.revive_nodes(job.execution_id, {j.node_id for j in revived if j.node_id}, tolerated)
    return [dispatch_of(j) for j in revived]


def discard(store: SqlStore, job_id: uuid.UUID, tenant_id: uuid.UUID | None, now: datetime) -> None:
    """Move a dead letter to the archive; its execution stays failed."""
    job = _dead(store, job_id, tenant_id)
    store.discard_dead_letter(job.id, now)


def _dead(store: SqlStore, job_id: uuid.UUID, tenant_id: uuid.UUID | None) -> JobRecord:
    job = store.dead_letter(job_id, tenant_id)
    if job is None:
        raise NotFound(
            f"no dead letter has id {job_id}; list them with `conveyor dlq list` (a requeued "
            f"one is not a dead letter any more)"
        )
    if job.status is JobStatus.DISCARDED:
        raise InvalidTransition(f"dead letter {job_id} was discarded; it stays in the archive")
    return job
