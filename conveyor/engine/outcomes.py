"""Outcomes a node chooses for itself: snooze (run again later, no attempt spent), skip, and
cancel its execution. None is a failure: none lands in the error history."""

from __future__ import annotations

from datetime import datetime, timedelta

from conveyor.engine import mapping
from conveyor.engine.cancellation import stop_execution
from conveyor.engine.claiming import NodeRun
from conveyor.engine.failure import Failed, drop_item, fail_node, map_stopped
from conveyor.engine.ports import Store
from conveyor.engine.settling import outcome_status, settle
from conveyor.engine.states import AttemptStatus, JobStatus, NodeStatus
from conveyor.exceptions import CancelExecution, NonRetryableError, Skip, Snooze


def snooze_node(
    store: Store, run: NodeRun, snooze: Snooze, now: datetime, duration: float
) -> Failed:
    """The try ends ``snoozed`` and the job waits ``snooze.seconds`` in the database, as a
    retry waits (retry_wait, promoted when due), with its attempt unspent. Past the node's
    ``max_snoozes`` snoozes in a row, or once its execution has finished, it is a failure
    (:func:`~conveyor.engine.failure.fail_node`), not retried; a map's item whose map failed
    meanwhile ends cancelled (:func:`~conveyor.engine.failure.drop_item`)."""
    job, node = run.job, run.node
    status = outcome_status(store, run.execution.id)
    if status is None or status.finished:
        return fail_node(store, run, snooze, now, duration)
    bound = node.snooze_bound
    if store.snoozes_in_a_row(job.id, job.try_number) >= bound:
        error = NonRetryableError(
            f"node {node.id!r} snoozed {bound} time(s) in a row, its max_snoozes, and asked "
            f"again ({snooze}); raise max_snoozes in its definition if its input may take "
            f"longer to be ready"
        )
        return fail_node(store, run, error, now, duration)
    store.finish_attempt(
        job.id, job.try_number, AttemptStatus.SNOOZED, now, duration, error=snooze.reason or None
    )
    if job.item_index is not None and not store.map_runs(run.execution.id, node.id):
        return drop_item(store, run, now, f"snoozed, not run again: {map_stopped(run)}")
    due = now + timedelta(seconds=snooze.seconds)
    if not store.schedule_snooze(job.id, due, try_number=job.try_number):
        return Failed(dispatches=[], outcome=None)  # reclaimed meanwhile
    if job.item_index is None:  # (a map's node runs on while an item snoozes)
        store.set_node(run.execution.id, node.id, NodeStatus.QUEUED)
    return Failed(
        dispatches=[], outcome=JobStatus.RETRY_WAIT, retry_in=snooze.seconds, snoozed=True
    )


def cancel_from_node(
    store: Store, run: NodeRun, cancel: CancelExecution, now: datetime, duration: float
) -> Failed:
    """The node ends ``cancelled`` with its reason, and its execution is cancelled as a
    client's cancel does (:func:`~conveyor.engine.cancellation.stop_execution`): nodes not
    started are cancelled, running ones told to stop; nothing is dead-lettered."""
    job, execution_id, node_id = run.job, run.execution.id, run.node.id
    reason = f"cancelled by node {node_id!r}" + (f": {cancel.reason}" if cancel.reason else "")
    store.finish_attempt(
        job.id, job.try_number, AttemptStatus.CANCELLED, now, duration, error=reason
    )
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, try_number=job.try_number,
        completed_at=now, last_error=reason,
    ):  # fmt: skip
        return Failed(dispatches=[], outcome=None)  # reclaimed meanwhile
    store.set_node(execution_id, node_id, NodeStatus.CANCELLED, finished_at=now, error=reason)
    status = outcome_status(store, execution_id)
    if status is None or status.finished:
        return Failed(dispatches=[], outcome=JobStatus.CANCELLED)
    # Should it fail or be cancelled meanwhile, it stays as it finished: the node is cancelled
    stopped = stop_execution(store, execution_id, now, reason)
    return Failed(
        dispatches=stopped.dispatches, outcome=JobStatus.CANCELLED, forget=tuple(stopped.forget)
    )


def skip_node(store: Store, run: NodeRun, skip: Skip, now: datetime, duration: float) -> Failed:
    """The node ends ``skipped``, as a branch not taken does, and settles: its successors run
    unless all their needs were skipped (:func:`~conveyor.engine.settling.settle`). Once its
    execution has finished, the node is cancelled as any try that ends then is. A map's item
    that skips settles as an item, its slot in the node's output None."""
    job, execution_id, node_id = run.job, run.execution.id, run.node.id
    status = outcome_status(store, execution_id)
    if status is None or status.finished:
        return fail_node(store, run, skip, now, duration)
    store.finish_attempt(
        job.id, job.try_number, AttemptStatus.SKIPPED, now, duration, error=skip.reason or None
    )
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, JobStatus.COMPLETED, try_number=job.try_number,
        completed_at=now,
    ):  # fmt: skip
        return Failed(dispatches=[], outcome=None)  # reclaimed meanwhile
    if job.item_index is None:
        store.set_node(execution_id, node_id, NodeStatus.SKIPPED, finished_at=now)
        after = settle(store, run, now)
    else:  # a map's item: settled, its slot in the output None
        after = mapping.settled(store, run, now)
    return Failed(
        dispatches=after.dispatches, forget=tuple(after.forget), outcome=JobStatus.COMPLETED,
        skipped=True,
    )  # fmt: skip
