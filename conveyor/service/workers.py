"""What the Celery workers call: plan an execution, run a node (its permits, claim, run, outcome),
run a batch of nodes, turn a webhook delivery into executions."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.exc import DataError

from conveyor import logs, nodes, tracing
from conveyor.batches import Member, run_batch
from conveyor.engine import (
    children,
    claiming,
    failure,
    mapping,
    node_types,
    outcomes,
    success,
    triggering,
    waits,
)
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.records import AfterCommit, Dispatch, NodeHints
from conveyor.engine.states import JobKind, JobStatus, Priority
from conveyor.exceptions import (
    CancelExecution,
    NodeCancelled,
    NonRetryableError,
    Skip,
    Snooze,
)
from conveyor.nodes import NodeContext
from conveyor.service.base import log, utcnow
from conveyor.service.continuing import Continuations, Taken

events = logs.get("conveyor.jobs")


# A failed try's outcome as its span says it (None: the try was reclaimed meanwhile).
_OUTCOMES: dict[JobStatus | None, str] = {
    JobStatus.RETRY_WAIT: "retry",
    JobStatus.DEAD_LETTER: "dead_letter",
    JobStatus.CANCELLED: "cancelled",
}


def _log_failure(
    job_log: Any, failed: failure.Failed, error: BaseException, duration: float
) -> None:
    """A failed try, at the level its outcome deserves."""
    tracing.outcome(_OUTCOMES.get(failed.outcome, "reclaimed"), error)
    fields = {"duration": round(duration, 3), "error": logs.short(failure.describe(error))}
    if failed.outcome is JobStatus.RETRY_WAIT:
        job_log.warning("retry scheduled", retry_in=round(failed.retry_in or 0.0, 3), **fields)
    elif failed.outcome is JobStatus.DEAD_LETTER:
        job_log.error("dead-lettered", **fields)
    else:
        job_log.info("job stopped", outcome=failed.outcome and failed.outcome.value, **fields)


# An outcome a node chose, as its log line says it.
_CHOSEN = {"snoozed": "snoozed", "skipped": "job skipped", "cancelled": "cancelled by the node"}


def _log_choice(
    job_log: Any, failed: failure.Failed, choice: Snooze | Skip | CancelExecution, duration: float
) -> None:
    """An outcome the node chose, logged at info, its span no error; a choice that did not
    hold (past max_snoozes, or its execution finished meanwhile) is logged as a failure."""
    if failed.skipped:
        chosen = "skipped"
    elif failed.snoozed:
        chosen = "snoozed"
    elif isinstance(choice, CancelExecution) and failed.outcome is JobStatus.CANCELLED:
        chosen = "cancelled"
    else:
        _log_failure(job_log, failed, choice, duration)
        return
    tracing.outcome(chosen)
    fields = {"duration": round(duration, 3), "reason": logs.short(choice.reason)}
    if failed.snoozed:
        fields["snooze_for"] = round(failed.retry_in or 0.0, 3)
    job_log.info(_CHOSEN[chosen], **fields)


@dataclass(frozen=True, kw_only=True)
class Ran:
    """What became of one node job's run on this worker: what its Celery task reports, so
    that Flower shows the truth (see :mod:`conveyor.tasks`)."""

    job_id: uuid.UUID
    # completed, retry_wait, dead_letter or cancelled; parked (or not runnable any more);
    # None: the message was dropped (its job was not queued any more, or taken meanwhile),
    # or, with ``reclaimed``, its try failed after recovery had reclaimed the job
    outcome: JobStatus | None
    reclaimed: bool = False  # its try ran and failed, its job reclaimed by recovery meanwhile
    workflow: str = ""
    node: str = ""
    error: str = ""  # the node's, when its try failed (cut at logs.ERROR_CHARS)
    retry_in: float | None = None
    snoozed: bool = False  # retry_wait because the node snoozed: no attempt spent
    by_node: bool = False  # the node skipped itself or cancelled its execution (``error``)

    @property
    def name(self) -> str:
        return f"{self.workflow}/{self.node}" if self.workflow else f"job {self.job_id}"


def _alone(job_id: uuid.UUID, hints: NodeHints | None) -> Dispatch:
    """A node job's message of its own (a batch's hand-back)."""
    return Dispatch(
        job_id=job_id,
        kind=JobKind.NODE,
        queue=NODE_QUEUE,
        priority=hints.priority if hints else Priority.NORMAL,
        workflow=hints.workflow or "" if hints else "",
        node=hints.node_id or "" if hints else "",
        hints=hints,
    )


def _failed(ran: Ran, failed: failure.Failed, error: BaseException) -> Ran:
    return replace(
        ran,
        outcome=failed.outcome,
        reclaimed=failed.outcome is None,
        error=logs.short(failure.describe(error)),  # cut as the logs cut it
        retry_in=failed.retry_in,
        snoozed=failed.snoozed,
    )


def _chose(ran: Ran, failed: failure.Failed, choice: Snooze | Skip | CancelExecution) -> Ran:
    """What a node's chosen outcome shows in Flower: a skip or a cancel says so, and why."""
    ran = _failed(ran, failed, choice)
    if failed.skipped:
        what = "skipped by the node"
    elif isinstance(choice, CancelExecution) and failed.outcome is JobStatus.CANCELLED:
        what = "cancelled by the node"
    else:
        return ran
    shown = f"{what}: {choice.reason}" if choice.reason else what
    return replace(ran, by_node=True, error=logs.short(shown))


class Workers(Continuations):
    """A worker's side: each task's message becomes one of these calls."""

    @property
    def cancel_poll(self) -> float:
        """Seconds between checks that a running node's execution is still running."""
        return self.watcher.poll

    @cancel_poll.setter
    def cancel_poll(self, seconds: float) -> None:
        self.watcher.poll = seconds

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between renewals of running jobs' heartbeats."""
        return self.watcher.heartbeat_interval

    @heartbeat_interval.setter
    def heartbeat_interval(self, seconds: float) -> None:
        self.watcher.heartbeat_interval = seconds

    def start_execution(self, job_id: uuid.UUID) -> None:
        started_ns = time.time_ns()
        planned = self.db.run(
            lambda s: triggering.start_execution(s, job_id, utcnow(), self.worker)
        )
        if planned.execution is None:
            return
        with tracing.plan_span(planned.execution, planned.workflow, started_ns):
            self._publish(planned.dispatches)

    def deliver_webhook(self, delivery_id: uuid.UUID) -> None:
        """The webhook worker: wake the waits a stored delivery's endpoint wakes, and start
        the workflows it matches."""
        delivered = self.db.run(
            lambda s: waits.deliver_webhook(s, delivery_id, utcnow(), self.event_retention)
        )
        self._forget(delivered.after.forget)
        self._publish(delivered.dispatches)

    def run_node(self, job_id: uuid.UUID, hints: NodeHints | None = None) -> Ran:
        """Take the job's permits (or park it), then claim, run and record it; the permits
        go back once the outcome is committed. ``hints``: the message's (see NodeHints)."""
        if self.gate is None:
            ran, taken = self._run_node(job_id, hints)
        else:
            permit = self.gate.admit(job_id, hints)
            if permit is None:
                return Ran(job_id=job_id, outcome=JobStatus.PARKED)
            try:
                ran, taken = self._run_node(job_id, hints)
            finally:
                self.gate.release(permit)
        self._continue(taken)
        return ran

    def _continue(self, taken: Taken | None) -> None:
        """Run the chain's steps this worker's successes claimed for it, one after another,
        each with the permits it was given before its claim (see :meth:`_complete`)."""
        streak = 1
        while taken is not None:
            run, permit = taken
            try:
                with tracing.node_try(run, time.time_ns()):
                    _, taken = self._try(run, streak)
            finally:
                if permit is not None and self.gate is not None:
                    self.gate.release(permit)
            streak += 1

    def run_nodes(self, members: Sequence[Member], budget: float) -> list[Ran]:
        """Run a batch message's node jobs one after another, each as :meth:`run_node` runs
        one; past ``budget`` seconds those not started are published again, one a message
        (see :mod:`conveyor.batches`). What became of those it ran, in order."""
        ran: list[Ran] = []
        run_batch(
            members,
            budget,
            self._hand_back,
            lambda job_id, hints: ran.append(self.run_node(job_id, hints)),
            self.durations.slow,
        )
        return ran

    def _hand_back(self, members: list[Member]) -> None:
        self._publish([_alone(job_id, hints) for job_id, hints in members], batch=False)
        log.info("a batch ran past its budget: %d job(s) handed back", len(members))

    def _run_node(
        self, job_id: uuid.UUID, hints: NodeHints | None = None
    ) -> tuple[Ran, Taken | None]:
        """Claim a node job, run the node outside any transaction, record the outcome."""
        claiming_at = time.time_ns()
        # The claim is one statement (PostgreSQL): it needs no transaction around it. Should
        # what follows it fail, the job is reclaimed as a dead worker's (no heartbeat).
        run = self.db.autocommit(
            lambda s: claiming.claim_node(
                s, job_id, utcnow(), self.worker, hints, output_bytes=self.bounds.output_bytes
            )
        )
        if run is None:
            logs.message_dropped(job_id, "job not queued any more")
            return Ran(job_id=job_id, outcome=None), None
        with tracing.node_try(run, claiming_at):
            return self._try(run)

    def _try(self, run: claiming.NodeRun, streak: int = 0) -> tuple[Ran, Taken | None]:
        """Run a claimed node, record its outcome and publish what it made ready; the next
        step it claimed for this worker instead, the ``streak`` th in a row (see
        :meth:`_complete`)."""
        item = {} if run.job.item_index is None else {"item_index": run.job.item_index}
        job_log = events.bind(
            job_id=str(run.job.id),
            execution_id=str(run.execution.id),
            node_id=run.node.id,
            **item,
            tenant_id=str(run.execution.tenant_id),
            workflow=run.workflow.name,
            queue=run.job.queue,
            attempt=run.attempt,
            **tracing.log_fields(),
        )
        # a continuation's "received" says so, and how many steps in a row it is
        job_log.info("job received", **({"continued": streak} if streak else {}))
        expands = mapping.makes_items(run)  # a map node's own try: it makes the items
        if node_types.starts_child(run.node) and not expands:  # (an item's: a child each)
            return self._start_child(run, job_log), None
        if node_types.waits_for_event(run.node):
            return self._begin_wait(run, job_log), None
        ctx = NodeContext(
            execution_id=str(run.execution.id), node_id=run.node.id, attempt=run.attempt,
            item=run.job.item, index=run.job.item_index,
        )  # fmt: skip
        self.watcher.watch(run.job.id, run.execution.id, ctx)
        ran = Ran(
            job_id=run.job.id,
            outcome=JobStatus.COMPLETED,
            workflow=run.workflow.name,
            node=run.node.id,
        )
        started = time.monotonic()
        taken: Taken | None = None
        try:
            if expands:
                output = mapping.items_of(run, self.bounds.map_items)
            else:
                output = nodes.execute(run.node, run.context, ctx, run.timeout, run.inputs)
        except (Snooze, Skip, CancelExecution) as exc:  # an outcome the node chose
            duration = time.monotonic() - started
            failed = self._record_choice(run, exc, duration)
            _log_choice(job_log, failed, exc, duration)
            after, ran = failed.after, _chose(ran, failed, exc)
        except Exception as exc:
            duration = time.monotonic() - started
            failed = self._record_failure(run, exc, duration)
            _log_failure(job_log, failed, exc, duration)
            after, ran = failed.after, _failed(ran, failed, exc)
        else:
            duration = time.monotonic() - started
            if expands:
                after, ran = self._record_items(run, output, duration, job_log, ran)
            elif ctx.told_to_stop:  # it saw ctx.cancelled: it may have returned early
                after, ran = self._record_stopped(run, output, duration, job_log, ran)
            else:
                after, ran, taken = self._record_success(
                    run, output, duration, job_log, ran, streak
                )
        finally:
            self.watcher.unwatch(run.job.id)
            self.durations.record(
                run.execution.workflow_id, run.node.id, time.monotonic() - started
            )
        self._after(after)
        return ran, taken

    def _start_child(self, run: claiming.NodeRun, job_log: Any) -> Ran:
        """A workflow node's try: one transaction leaves its job waiting and starts the
        child (whose first jobs are published after commit), or fails the try. Nothing runs
        here while the child does: the worker slot and the permits are free once this
        returns."""
        ran = Ran(
            job_id=run.job.id, outcome=JobStatus.WAITING_CHILD, workflow=run.workflow.name,
            node=run.node.id,
        )  # fmt: skip
        started = self.db.run(
            lambda s: children.start_child(
                s,
                run,
                utcnow(),
                max_depth=self.max_child_depth,
                max_children=self.bounds.children,
                rng=self._rng,
            )
        )
        self._publish(started.dispatches)
        if started.failed is not None:  # (its failure may have stopped its execution)
            self._forget(started.failed.forget)
        if started.failed is not None and started.error is not None:
            _log_failure(job_log, started.failed, started.error, 0.0)
            return _failed(ran, started.failed, started.error)
        if not started.waiting:
            job_log.info("job stopped", outcome=None, reason="reclaimed before its child started")
            return replace(ran, outcome=None)
        tracing.outcome("waiting_child")
        child = str(started.child_id) if started.child_id else "started before"
        job_log.info("child started", child_execution_id=child)
        return ran

    def _begin_wait(self, run: claiming.NodeRun, job_log: Any) -> Ran:
        """A wait node's try: one transaction takes an event kept for it, or leaves its job
        waiting for one (nothing runs here meanwhile: the worker slot and the permits are
        free once this returns), or fails the try."""
        ran = Ran(
            job_id=run.job.id, outcome=JobStatus.WAITING_EVENT, workflow=run.workflow.name,
            node=run.node.id,
        )  # fmt: skip
        began = self.db.run(lambda s: waits.begin_wait(s, run, utcnow(), self._rng))
        self._after(began.after)
        if began.failed is not None and began.error is not None:
            _log_failure(job_log, began.failed, began.error, 0.0)
            return _failed(ran, began.failed, began.error)
        if began.woke:
            job_log.info("wait took a kept event", waited_for=waits.waits_for(run)[0])
            return replace(ran, outcome=JobStatus.COMPLETED)
        if not began.waiting:
            job_log.info("job stopped", outcome=None, reason="reclaimed before its wait began")
            return replace(ran, outcome=None)
        tracing.outcome("waiting_event")
        job_log.info("waiting for an event", waited_for=waits.waits_for(run)[0])
        return ran

    def _record_success(
        self,
        run: claiming.NodeRun,
        output: Any,
        duration: float,
        job_log: Any,
        ran: Ran,
        streak: int = 0,
    ) -> tuple[AfterCommit, Ran, Taken | None]:
        taken: Taken | None = None
        try:
            # in one statement where it can (a chain's step; or it made no successor ready),
            # else a transaction
            stepped = self._step(run, output, duration, streak)
            if stepped is not None:
                after, taken = stepped
            elif (
                done := self.db.autocommit(
                    lambda s: success.complete_fast(s, run, output, utcnow(), duration)
                )
            ) is not None:
                after = AfterCommit(dispatches=done)
                if run.job.item_index is not None:  # the held item it released, run next
                    after, taken = self._take_released(after, streak)
            else:
                after, taken = self._complete(run, output, duration, streak)
        except DataError as exc:
            return (*self._output_refused(run, exc, duration, job_log, ran), None)
        job_log.info("job completed", duration=round(duration, 3))
        tracing.outcome("completed")
        return after, ran, taken

    def _record_items(
        self, run: claiming.NodeRun, items: list[Any], duration: float, job_log: Any, ran: Ran
    ) -> tuple[AfterCommit, Ran]:
        """A map node's own try: the list it gave, a job per item (or, empty, the node done)."""
        try:
            after = self.db.run(
                lambda s: success.expand(s, run, items, utcnow(), duration, self.map_window)
            )
        except DataError as exc:
            return self._output_refused(run, exc, duration, job_log, ran)
        job_log.info("map items made", items=len(items), duration=round(duration, 3))
        tracing.outcome("completed")
        return after, ran

    def _record_stopped(
        self, run: claiming.NodeRun, output: Any, duration: float, job_log: Any, ran: Ran
    ) -> tuple[AfterCommit, Ran]:
        stopped = NodeCancelled(
            f"node {run.node.id!r} returned after it was told to stop, and its execution was "
            f"resumed meanwhile: it runs again"
        )
        try:
            failed = self.db.run(
                lambda s: failure.complete_stopped(s, run, output, stopped, utcnow(), duration)
            )
        except DataError as exc:
            return self._output_refused(run, exc, duration, job_log, ran)
        if failed is None:  # its execution is still finished: cancelled, its output kept
            tracing.outcome("cancelled")
            job_log.info("job stopped", outcome="cancelled", duration=round(duration, 3))
            return AfterCommit(), replace(ran, outcome=JobStatus.CANCELLED)
        _log_failure(job_log, failed, stopped, duration)
        return failed.after, _failed(ran, failed, stopped)

    def _output_refused(
        self, run: claiming.NodeRun, exc: DataError, duration: float, job_log: Any, ran: Ran
    ) -> tuple[AfterCommit, Ran]:
        """The database refused the node's output: trying again cannot help."""
        error = NonRetryableError(f"the node's output could not be stored: {exc.orig}")
        failed = self._record_failure(run, error, duration)
        _log_failure(job_log, failed, error, duration)
        return failed.after, _failed(ran, failed, error)

    def _record_failure(
        self, run: claiming.NodeRun, error: BaseException, duration: float
    ) -> failure.Failed:
        failed = self.db.run(
            lambda s: failure.fail_node(s, run, error, utcnow(), duration, self._rng)
        )
        if failed.outcome is JobStatus.DEAD_LETTER:  # a failed execution's children past the
            self._stop_orphans()  # share its transaction stopped
        return failed

    def _record_choice(
        self, run: claiming.NodeRun, choice: Snooze | Skip | CancelExecution, duration: float
    ) -> failure.Failed:
        """Record a snooze, a skip, or the node's cancel of its execution."""
        if isinstance(choice, Snooze):
            return self.db.run(lambda s: outcomes.snooze_node(s, run, choice, utcnow(), duration))
        if isinstance(choice, Skip):
            return self.db.run(lambda s: outcomes.skip_node(s, run, choice, utcnow(), duration))
        failed = self.db.run(
            lambda s: outcomes.cancel_from_node(s, run, choice, utcnow(), duration)
        )
        if failed.outcome is JobStatus.CANCELLED:  # its children past the stop's share
            self._stop_orphans()
        return failed
