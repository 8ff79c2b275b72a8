"""A node's failed (or stopped, or lost) try recorded: retry, dead-letter, or cancel, as the
retry policy and the execution's status decide."""

from __future__ import annotations

import random
import traceback
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from conveyor.engine import mapping, retry, trigger_limits
from conveyor.engine.bounds import Bounds
from conveyor.engine.claiming import NodeRun
from conveyor.engine.ports import Store
from conveyor.engine.records import (
    AfterCommit,
    Dispatch,
    JobRecord,
)
from conveyor.engine.settling import node_failed, outcome_status
from conveyor.engine.states import (
    AttemptStatus,
    JobStatus,
    NodeStatus,
)
from conveyor.engine.success import complete_node
from conveyor.engine.workflows import load_workflow
from conveyor.exceptions import (
    ConveyorError,
    NodeCancelled,
    NodeError,
    NodeTimeout,
    TemplateError,
    WorkerLost,
)

TRACEBACK_CHARS = 8_000  # a try's traceback is kept to this many characters


@dataclass(frozen=True, kw_only=True)
class Failed:
    """What a failed try led to."""

    dispatches: list[Dispatch]
    # retry_wait, dead_letter or cancelled (completed: skipped); None: taken meanwhile
    outcome: JobStatus | None
    retry_in: float | None = None
    snoozed: bool = False  # the node snoozed (conveyor.Snooze): retry_wait, no attempt spent
    skipped: bool = False  # the node ended itself skipped (conveyor.Skip): job completed
    forget: tuple[uuid.UUID, ...] = ()  # node jobs it cancelled before they ran (the limiter's)

    @property
    def after(self) -> AfterCommit:
        """What is left to do after commit: the messages, and the jobs to forget."""
        return AfterCommit(dispatches=self.dispatches, forget=list(self.forget))


def complete_stopped(
    store: Store, run: NodeRun, output: Any, error: NodeCancelled, now: datetime,
    duration: float,
) -> Failed | None:  # fmt: skip
    """Record a try that returned after it was told to stop (``ctx.cancelled``): it may have
    stopped early, so what it returned may be partial. While its execution is still finished,
    the node is cancelled with that output kept (:func:`~conveyor.engine.success.complete_node`;
    None). If the execution runs again, the stop was undone while the node ended (a dead
    letter requeued meanwhile): the try counts as stopped, as one that ended with ``error``,
    and the node runs again; its output is not taken for a successor's input."""
    status = outcome_status(store, run.execution.id)
    if status is None or status.finished:
        complete_node(store, run, output, now, duration)
        return None
    return fail_node(store, run, error, now, duration)


def fail_node(
    store: Store,
    run: NodeRun,
    error: BaseException,
    now: datetime,
    duration: float,
    rng: random.Random | None = None,
) -> Failed:
    """Record a failed try: wait and retry, or dead-letter and fail (or continue) the run. A
    map's item is not retried once its map has failed (:func:`drop_item`)."""
    job, execution_id, node_id = run.job, run.execution.id, run.node.id
    item = job.item_index is not None  # a map's item: its node is the map's counter
    message = describe(error)
    retryable = is_retryable(error)
    store.finish_attempt(
        job.id,
        job.try_number,
        AttemptStatus.FAILED,
        now,
        duration,
        error=message,
        timed_out=isinstance(error, NodeTimeout),
        traceback=traceback_of(error),
    )
    status = outcome_status(store, execution_id)
    if status is not None and status.finished:  # stopped because it was cancelled or failed
        if not store.transition_job(
            job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, try_number=job.try_number,
            completed_at=now, last_error=message,
        ):  # fmt: skip
            return Failed(dispatches=[], outcome=None)  # reclaimed meanwhile
        if not item:  # (a map's node was cancelled with its execution: its items settle nothing)
            store.set_node(
                execution_id, node_id, NodeStatus.CANCELLED, finished_at=now, error=message
            )
        return Failed(dispatches=[], outcome=JobStatus.CANCELLED)
    # The execution runs: a NodeCancelled means a cancel that was undone since.
    decision = (
        retry.decide_stopped(job.attempt)
        if isinstance(error, NodeCancelled)
        else retry.decide_failure(
            trigger_limits.retry_policy(run.workflow, run.node, run.execution.limits),
            attempt=job.attempt,
            retryable=retryable,
            rng=rng,
        )
    )
    if decision.retry_in is not None:
        if item and not store.map_runs(execution_id, node_id):  # it failed fast meanwhile
            return drop_item(store, run, now, f"{message} (not retried: {map_stopped(run)})")
        due = now + timedelta(seconds=decision.retry_in)
        if not store.schedule_retry(job.id, due, message, try_number=job.try_number):
            return Failed(dispatches=[], outcome=None)
        if not item:
            store.set_node(execution_id, node_id, NodeStatus.QUEUED, error=message)
        return Failed(dispatches=[], outcome=JobStatus.RETRY_WAIT, retry_in=decision.retry_in)
    if not store.transition_job(
        job.id,
        JobStatus.PROCESSING,
        JobStatus.DEAD_LETTER,
        try_number=job.try_number,
        completed_at=now,
        last_error=f"{message} ({decision.reason})",
    ):
        return Failed(dispatches=[], outcome=None)
    if item:
        after = mapping.item_dead(store, run, now, message)
    else:
        store.set_node(execution_id, node_id, NodeStatus.FAILED, finished_at=now, error=message)
        failed = f"node {node_id!r} failed after {job.attempt} attempt(s): {message}"
        after = node_failed(store, run, now, failed)
    return Failed(
        dispatches=after.dispatches, forget=tuple(after.forget), outcome=JobStatus.DEAD_LETTER
    )


def drop_item(store: Store, run: NodeRun, now: datetime, error: str) -> Failed:
    """A map's item that would run again after its map stopped running (it failed fast, and
    its execution goes on: the node continues on failure): its job ends cancelled with
    ``error`` and no try follows, as the items not started were cancelled; another try
    would only repeat the item's effects for a map whose outcome is settled."""
    job = run.job
    if not store.transition_job(
        job.id, JobStatus.PROCESSING, JobStatus.CANCELLED, try_number=job.try_number,
        completed_at=now, last_error=error,
    ):  # fmt: skip
        return Failed(dispatches=[], outcome=None)  # reclaimed meanwhile
    return Failed(dispatches=[], outcome=JobStatus.CANCELLED)


def map_stopped(run: NodeRun) -> str:
    """Why an item of a map that failed fast is not tried again (its job's last error)."""
    return f"its map node {run.node.id!r} failed while it ran"


def reclaim(
    store: Store,
    job: JobRecord,
    now: datetime,
    rng: random.Random | None = None,
    *,
    output_bytes: int = Bounds().output_bytes,
) -> Failed:
    """A node job whose worker stopped sending heartbeats: its try failed (the worker may
    have died of the node itself), and the retry policy decides what comes next
    (``output_bytes``: as :attr:`NodeRun.output_bytes`, for a map's last item)."""
    execution = store.execution(job.execution_id)
    workflow, _ = load_workflow(store, job.workflow_id)
    assert job.node_id is not None
    run = NodeRun(
        job=job, execution=execution, workflow=workflow, node=workflow.node(job.node_id),
        context={}, output_bytes=output_bytes,
    )  # fmt: skip
    error = WorkerLost("the worker running it stopped sending heartbeats")
    return fail_node(store, run, error, now, 0.0, rng)


def is_retryable(error: BaseException) -> bool:
    """Node errors say so themselves; a template error fails the same way every time."""
    if isinstance(error, NodeError):
        return error.retryable
    return not isinstance(error, TemplateError)


def traceback_of(error: BaseException) -> str | None:
    """A failed try's traceback as stored: its frames' files, lines and code, and the error
    (what ``describe`` stores already), never a frame's local values; cut in the middle to
    TRACEBACK_CHARS, keeping where it began and where it was raised. None for an error never
    raised (a worker lost, a timeout the engine saw)."""
    if error.__traceback__ is None:
        return None
    text = "".join(traceback.format_exception(error)).replace("\x00", "")
    if len(text) <= TRACEBACK_CHARS:
        return text
    half = TRACEBACK_CHARS // 2
    return f"{text[:half]}\n… {len(text) - 2 * half} characters cut …\n{text[-half:]}"


def describe(error: BaseException) -> str:
    text = (str(error) or error.__class__.__name__).replace("\x00", "")
    if isinstance(error, ConveyorError):
        return text
    return f"{error.__class__.__name__}: {text}"
