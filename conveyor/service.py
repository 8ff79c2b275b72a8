"""The application service: what the CLI, the Celery tasks and (later) the API call.

Each method is one or two transactions through :class:`Database`, publishing through the
:class:`Dispatcher` only after commit. Nothing here knows Celery.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import DataError

from conveyor import logs, nodes
from conveyor.batches import Durations, Member, run_batch
from conveyor.engine import (
    cancellation,
    claiming,
    credentials,
    dead_letters,
    due,
    failure,
    ready,
    subscriptions,
    success,
    triggering,
    workflows,
)
from conveyor.engine.definitions import Workflow
from conveyor.engine.limits import Limits
from conveyor.engine.ports import Dispatcher, Limiter
from conveyor.engine.queues import NODE_QUEUE, may_hold
from conveyor.engine.records import Dispatch, NodeHints, TenantRef, WorkflowRecord
from conveyor.engine.states import JobKind, JobStatus, Priority, TriggerSource
from conveyor.exceptions import (
    AuthError,
    ConveyorError,
    LimitError,
    NodeCancelled,
    NonRetryableError,
    NotFound,
    ReplayedDelivery,
    SignatureError,
)
from conveyor.limiter.gate import BrokerHolds, Gate
from conveyor.nodes import NodeContext
from conveyor.scheduler import schedules
from conveyor.store import DEFAULT_TENANT, Database, SqlStore
from conveyor.watcher import Watcher

log = logging.getLogger("conveyor")
events = logs.get("conveyor.jobs")


def _log_failure(
    job_log: Any, failed: failure.Failed, error: BaseException, duration: float
) -> None:
    """A failed try, at the level its outcome deserves."""
    fields = {"duration": round(duration, 3), "error": logs.short(failure.describe(error))}
    if failed.outcome is JobStatus.RETRY_WAIT:
        job_log.warning("retry scheduled", retry_in=round(failed.retry_in or 0.0, 3), **fields)
    elif failed.outcome is JobStatus.DEAD_LETTER:
        job_log.error("dead-lettered", **fields)
    else:
        job_log.info("job stopped", outcome=failed.outcome and failed.outcome.value, **fields)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _alone(job_id: uuid.UUID, hints: NodeHints | None) -> Dispatch:
    """A node job's message of its own (a batch's hand-back)."""
    return Dispatch(
        job_id=job_id,
        kind=JobKind.NODE,
        queue=NODE_QUEUE,
        priority=hints.priority if hints else Priority.NORMAL,
        label=f"node={hints.node_id}" if hints and hints.node_id else "",
        hints=hints,
    )


class Conveyor:
    """Triggers, runs and steers executions over a database and a dispatcher."""

    def __init__(
        self,
        database: Database,
        dispatcher: Dispatcher,
        *,
        worker: str = "",
        limiter: Limiter | None = None,
        limits: Limits | None = None,
        lease: float = 30.0,
        age_low_after: float = 300.0,
        misfire_grace: float = 120.0,
        resend_after: float = 60.0,
        broker_holds: BrokerHolds = lambda: None,
        replay_window: timedelta = timedelta(days=30),
    ) -> None:
        self.db = database
        self.replay_window = replay_window  # a GitHub body received again in it is refused
        self.dispatcher = dispatcher
        self.worker = worker
        self.age_low_after = age_low_after
        self.misfire_grace = misfire_grace
        self.watcher = Watcher(database)
        self.durations = Durations()  # of the nodes this process ran (for batches)
        self._rng = random.Random()
        self.gate = (
            Gate(
                database,
                limiter,
                defaults=limits or Limits(global_=100, tenant=10, workflow=5),
                lease=lease,
                publish=self._publish,
                resend_after=resend_after,
                broker_holds=broker_holds,
            )
            if limiter is not None
            else None
        )

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

    # -- applications -----------------------------------------------------------------------

    def apply(
        self, workflow: Workflow, tenant: str = DEFAULT_TENANT
    ) -> tuple[WorkflowRecord, bool]:
        """Store the definition if it changed, and make its declared schedules match it."""

        def work(store: SqlStore) -> tuple[WorkflowRecord, bool]:
            applied = workflows.apply_workflow(store, tenant, workflow, utcnow())
            schedules.sync_definition(store, tenant, workflow, utcnow())
            subscriptions.sync(store, tenant, workflow)
            return applied

        return self.db.run(work)

    def trigger(
        self,
        workflow: str,
        input: Any = None,
        *,
        tenant: str = DEFAULT_TENANT,
        priority: Priority | None = None,
        source: TriggerSource = TriggerSource.API,
    ) -> uuid.UUID:
        """Start an execution; its start job is published once the row is committed."""
        return self.start(workflow, input, tenant=tenant, priority=priority, source=source)[0]

    def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        tenant: str = DEFAULT_TENANT,
        priority: Priority | None = None,
        source: TriggerSource = TriggerSource.API,
        idempotency_key: str | None = None,
        dedupe_key: str | None = None,
    ) -> tuple[uuid.UUID, bool]:
        """Like :meth:`trigger`; with an idempotency key the tenant used before, the
        execution it made is returned instead. (execution id, whether it was made before)."""
        # Its writes are one statement each (PostgreSQL): no transaction round trips.
        result = self.db.autocommit(
            lambda s: triggering.trigger(
                s,
                workflow_name=workflow,
                tenant=tenant,
                input=input,
                priority=priority,
                source=source,
                now=utcnow(),
                idempotency_key=idempotency_key,
                dedupe_key=dedupe_key,
            )
        )
        self._publish_now(result.dispatches, f"execution {result.execution_id}")
        return result.execution_id, result.replayed

    def emit(self, tenant: str, event_type: str, payload: Any) -> list[uuid.UUID]:
        """Start every workflow of the tenant that subscribes to the event type."""
        started = self.db.run(
            lambda s: subscriptions.emit_event(s, tenant, event_type, payload, utcnow())
        )
        self._publish_now([d for t in started for d in t.dispatches], "the event's executions")
        return [t.execution_id for t in started]

    def authenticate(self, key: str) -> TenantRef:
        """The tenant an API key acts for, or :class:`AuthError`."""
        prefix = credentials.key_prefix(key)
        with self.db.transaction() as store:
            found = store.api_key(prefix)
        if found is None or not credentials.key_matches(key, found[0]):
            raise AuthError()
        return found[1]

    def receive_webhook(
        self, endpoint_id: uuid.UUID, body: bytes, headers: Mapping[str, str]
    ) -> uuid.UUID:
        """Verify and store a delivery, then hand it to the webhook worker; its id.

        A bad signature stores nothing but a count on the endpoint (and a log line without
        the body); a delivery id the endpoint received before is a :class:`DuplicateDelivery`,
        and a GitHub body it received within ``replay_window`` is a :class:`ReplayedDelivery`
        whatever its delivery id.
        """
        with self.db.transaction() as store:
            endpoint = store.endpoint(endpoint_id)
        if endpoint is None:
            raise NotFound(f"no webhook endpoint has id {endpoint_id}")
        try:
            verified = credentials.verify(endpoint.scheme, endpoint.secret, body, headers)
        except SignatureError as exc:
            self.db.run(lambda s: s.count_rejected(endpoint.id))
            log.warning("webhook to endpoint %s refused: %s", endpoint.name, exc)
            raise
        try:
            stored = self.db.run(
                lambda s: subscriptions.store_delivery(
                    s, endpoint, verified, utcnow(), self.replay_window
                )
            )
        except ReplayedDelivery as exc:
            log.warning("webhook to endpoint %s refused: %s", endpoint.name, exc)
            raise
        self._publish_now([subscriptions.delivery_dispatch(stored)], f"delivery {stored}")
        return stored

    def deliver_webhook(self, delivery_id: uuid.UUID) -> None:
        """The webhook worker: start the workflows a stored delivery matches."""
        started = self.db.run(lambda s: subscriptions.deliver_webhook(s, delivery_id, utcnow()))
        self._publish([d for t in started for d in t.dispatches])

    def cancel(self, execution_id: uuid.UUID) -> None:
        cancelled = self.db.run(lambda s: cancellation.cancel_execution(s, execution_id, utcnow()))
        if self.gate is not None and cancelled:
            try:
                self.gate.forget(cancelled)
            except LimitError:  # they are dropped when their turn comes instead
                log.warning("could not tell the limiter about %d cancelled jobs", len(cancelled))

    # -- workers ------------------------------------------------------------------------------

    def start_execution(self, job_id: uuid.UUID) -> None:
        self._publish(
            self.db.run(lambda s: triggering.start_execution(s, job_id, utcnow(), self.worker))
        )

    def run_node(self, job_id: uuid.UUID, hints: NodeHints | None = None) -> None:
        """Take the job's permits (or park it), then claim, run and record it; the permits
        go back once the outcome is committed. ``hints``: the message's (see NodeHints)."""
        if self.gate is None:
            self._run_node(job_id, hints)
            return
        permit = self.gate.admit(job_id, hints)
        if permit is None:
            return
        try:
            self._run_node(job_id, hints)
        finally:
            self.gate.release(permit)

    def run_nodes(self, members: Sequence[Member], budget: float) -> None:
        """Run a batch message's node jobs one after another, each as :meth:`run_node` runs
        one; past ``budget`` seconds those not started are published again, one a message
        (see :mod:`conveyor.batches`)."""
        run_batch(members, budget, self._hand_back, self.run_node, self.durations.slow)

    def _hand_back(self, members: list[Member]) -> None:
        self._publish([_alone(job_id, hints) for job_id, hints in members], batch=False)
        log.info("a batch ran past its budget: %d job(s) handed back", len(members))

    def _run_node(self, job_id: uuid.UUID, hints: NodeHints | None = None) -> None:
        """Claim a node job, run the node outside any transaction, record the outcome."""
        # The claim is one statement (PostgreSQL): it needs no transaction around it. Should
        # what follows it fail, the job is reclaimed as a dead worker's (no heartbeat).
        run = self.db.autocommit(
            lambda s: claiming.claim_node(s, job_id, utcnow(), self.worker, hints)
        )
        if run is None:
            logs.message_dropped(job_id, "job not queued any more")
            return
        job_log = events.bind(
            job_id=str(run.job.id),
            execution_id=str(run.execution.id),
            node_id=run.node.id,
            tenant_id=str(run.execution.tenant_id),
            workflow=run.workflow.name,
            queue=run.job.queue,
            attempt=run.attempt,
        )
        job_log.info("job received")
        ctx = NodeContext(
            execution_id=str(run.execution.id), node_id=run.node.id, attempt=run.attempt
        )
        self.watcher.watch(run.job.id, run.execution.id, ctx)
        started = time.monotonic()
        try:
            output = nodes.execute(run.node, run.context, ctx, run.timeout)
        except Exception as exc:
            duration = time.monotonic() - started
            failed = self._record_failure(run, exc, duration)
            _log_failure(job_log, failed, exc, duration)
            dispatches = failed.dispatches
        else:
            duration = time.monotonic() - started
            if ctx.told_to_stop:  # it saw ctx.cancelled: it may have returned early
                dispatches = self._record_stopped(run, output, duration, job_log)
            else:
                dispatches = self._record_success(run, output, duration, job_log)
        finally:
            self.watcher.unwatch(run.job.id)
            self.durations.record(
                run.execution.workflow_id, run.node.id, time.monotonic() - started
            )
        self._publish(dispatches)

    def _record_success(
        self, run: claiming.NodeRun, output: Any, duration: float, job_log: Any
    ) -> list[Dispatch]:
        try:
            if self.db.autocommit(
                lambda s: success.complete_alone(s, run, output, utcnow(), duration)
            ):
                dispatches = []  # done in one statement: it made no successor ready
            else:
                dispatches = self.db.run(
                    lambda s: success.complete_node(s, run, output, utcnow(), duration)
                )
        except DataError as exc:
            return self._output_refused(run, exc, duration, job_log)
        job_log.info("job completed", duration=round(duration, 3))
        return dispatches

    def _record_stopped(
        self, run: claiming.NodeRun, output: Any, duration: float, job_log: Any
    ) -> list[Dispatch]:
        stopped = NodeCancelled(
            f"node {run.node.id!r} returned after it was told to stop, and its execution was "
            f"resumed meanwhile: it runs again"
        )
        try:
            failed = self.db.run(
                lambda s: failure.complete_stopped(s, run, output, stopped, utcnow(), duration)
            )
        except DataError as exc:
            return self._output_refused(run, exc, duration, job_log)
        if failed is None:  # its execution is still finished: cancelled, its output kept
            job_log.info("job stopped", outcome="cancelled", duration=round(duration, 3))
            return []
        _log_failure(job_log, failed, stopped, duration)
        return failed.dispatches

    def _output_refused(
        self, run: claiming.NodeRun, exc: DataError, duration: float, job_log: Any
    ) -> list[Dispatch]:
        """The database refused the node's output: trying again cannot help."""
        error = NonRetryableError(f"the node's output could not be stored: {exc.orig}")
        failed = self._record_failure(run, error, duration)
        _log_failure(job_log, failed, error, duration)
        return failed.dispatches

    def _record_failure(
        self, run: claiming.NodeRun, error: BaseException, duration: float
    ) -> failure.Failed:
        return self.db.run(
            lambda s: failure.fail_node(s, run, error, utcnow(), duration, self._rng)
        )

    def promote_due(self, limit: int = 500) -> int:
        """Publish the retry and delay jobs whose time has come; how many were published."""
        dispatches = self.db.run(lambda s: due.promote_due(s, utcnow(), limit))
        self._publish(dispatches)
        return len(dispatches)

    def age_queued(self, limit: int = 500) -> int:
        """Re-publish at normal priority the low jobs that waited past the ageing limit."""
        dispatches = self.db.run(lambda s: due.age_queued(s, utcnow(), self.age_low_after, limit))
        self._publish(dispatches)
        if dispatches:
            log.info(
                "%d low-priority job(s) waited past the ageing limit: now normal", len(dispatches)
            )
        return len(dispatches)

    def check_schedules(self, batch: int = 500) -> int:
        """Start the runs of every due schedule, a batch per transaction, each published
        after its commit; how many runs were started."""
        started = 0
        while True:
            checked = self.db.run(
                lambda s: schedules.check_due(s, utcnow(), limit=batch, grace=self.misfire_grace)
            )
            self._publish(checked.dispatches)
            started += len(checked.dispatches)
            if checked.claimed < batch:
                return started

    def requeue_dead_letters(
        self, job_ids: Sequence[uuid.UUID], tenant_id: uuid.UUID | None = None
    ) -> dict[uuid.UUID, str | None]:
        """Resume each dead letter's execution from it (see :mod:`engine.dead_letters`), each
        in its own transaction; for each id, None when done or why it was refused."""
        return self._each(
            job_ids, lambda s, job_id: dead_letters.requeue(s, job_id, tenant_id, utcnow())
        )

    def discard_dead_letters(
        self, job_ids: Sequence[uuid.UUID], tenant_id: uuid.UUID | None = None
    ) -> dict[uuid.UUID, str | None]:
        """Move dead letters to the archive; for each id, None when done or why not."""

        def discard(store: SqlStore, job_id: uuid.UUID) -> list[Dispatch]:
            dead_letters.discard(store, job_id, tenant_id, utcnow())
            return []

        return self._each(job_ids, discard)

    def _each(
        self,
        job_ids: Sequence[uuid.UUID],
        work: Callable[[SqlStore, uuid.UUID], list[Dispatch]],
    ) -> dict[uuid.UUID, str | None]:
        outcomes: dict[uuid.UUID, str | None] = {}
        for job_id in dict.fromkeys(job_ids):
            try:
                dispatches = self.db.run(lambda s, job_id=job_id: work(s, job_id))  # type: ignore[misc]
            except ConveyorError as exc:
                outcomes[job_id] = str(exc)
                continue
            self._publish(dispatches)
            outcomes[job_id] = None
        return outcomes

    def recover(
        self,
        *,
        heartbeat_timeout: float,
        lost_after: float,
        broker_holds: Callable[[], dict[str, int] | None] = lambda: None,
        batch: int = 500,
    ) -> dict[str, int]:
        """The recovery sweep; how many of each it repaired (also counted in the database).

        - ``reclaimed``: node jobs processing whose heartbeat is older than
          ``heartbeat_timeout``: their try failed (worker lost), the retry policy decides;
        - ``republished``: jobs (and webhook deliveries) queued for over ``lost_after``
          seconds whose queue in the broker cannot hold them all (``broker_holds``: at most
          how many jobs each queue's waiting messages name; None when it cannot tell, and
          then each is re-published): a message was lost (Redis flushed, a crash between
          commit and publish, a worker killed holding it). A duplicate is harmless: the job
          is claimed once. A job is re-published at most once every ``lost_after`` seconds,
          however many sweeps run (see :meth:`SqlStore.claim_resend`).
        """
        now = utcnow()

        def reclaim(store: SqlStore) -> list[failure.Failed]:
            stale = store.stale_processing(now - timedelta(seconds=heartbeat_timeout), batch)
            failed = [failure.reclaim(store, job, now, self._rng) for job in stale]
            store.count_recovered("reclaimed", len(failed))
            return failed

        reclaimed = self.db.run(reclaim)
        for failed in reclaimed:
            self._publish(failed.dispatches)
        with self.db.transaction() as store:
            stale = store.stale_queued(now - timedelta(seconds=lost_after), batch)
            waiting = store.stale_deliveries(now - timedelta(seconds=lost_after), batch)
        messages = [ready.dispatch_of(job) for job in stale]
        messages += [subscriptions.delivery_dispatch(d) for d in waiting]
        by_queue: dict[str, list[Dispatch]] = {}
        for message in messages:
            by_queue.setdefault(message.queue, []).append(message)
        held = broker_holds()
        lost = [
            message
            for queue, waiting_there in by_queue.items()
            if not may_hold(held, queue, len(waiting_there))
            for message in waiting_there
        ]
        lost = self._claim_resend(lost, JobStatus.QUEUED, now, lost_after)
        self._publish(lost)
        self.db.run(lambda s: s.count_recovered("republished", len(lost)))
        done = {"reclaimed": len(reclaimed), "republished": len(lost)}
        if any(done.values()):
            log.warning("recovery: %s", ", ".join(f"{k} {v}" for k, v in done.items() if v))
        return done

    def _claim_resend(
        self, messages: list[Dispatch], status: JobStatus, now: datetime, lapse: float
    ) -> list[Dispatch]:
        """The messages of jobs this process claimed to re-send (a webhook delivery's, which
        names no job, goes as it is)."""
        jobs = [m.job_id for m in messages if m.kind is not JobKind.WEBHOOK]
        if not jobs:
            return messages
        since = now - timedelta(seconds=lapse)
        claimed = self.db.run(lambda s: s.claim_resend(jobs, status, now, since))
        return [m for m in messages if m.kind is JobKind.WEBHOOK or m.job_id in claimed]

    def prune(
        self,
        older_than: timedelta,
        batch: int = 1000,
        most: int = 100_000,
        *,
        archive_older_than: timedelta | None = None,
    ) -> int:
        """The retention sweep: delete the executions finished longer ago than
        ``older_than`` (see :meth:`SqlStore.prune_finished`), a batch per transaction, at most
        ``most`` per call; those holding a dead letter discarded to the archive only when it
        was discarded longer ago than ``archive_older_than`` (None: never). How many were
        deleted."""
        now = utcnow()
        cutoff = now - older_than
        archive_cutoff = None if archive_older_than is None else now - archive_older_than
        pruned = self._in_batches(
            lambda s: s.prune_finished(cutoff, batch, archive_cutoff), batch, most
        )
        if pruned:
            log.info("retention: %d finished execution(s) deleted", pruned)
        # GitHub signatures older than the replay window refuse nothing any more
        window = now - self.replay_window
        if forgotten := self._in_batches(lambda s: s.forget_signatures(window, batch), batch, most):
            log.info("retention: %d webhook signature(s) past the replay window deleted", forgotten)
        return pruned

    def _in_batches(self, work: Callable[[SqlStore], int], batch: int, most: int) -> int:
        """Run ``work`` (which deletes up to ``batch`` rows) a transaction at a time until it
        deletes fewer, or ``most`` in all; how many it deleted."""
        done = 0
        while done < most:
            deleted = self.db.run(work)
            done += deleted
            if deleted < batch:
                break
        return done

    def sweep_limits(self) -> int:
        """The limiter's safety net (see :meth:`Gate.sweep`); 0 without limits."""
        return self.gate.sweep(self.age_low_after) if self.gate is not None else 0

    # -- plumbing -----------------------------------------------------------------------------

    def _publish_now(self, dispatches: Sequence[Dispatch], what: str) -> None:
        """Publish for a caller that answers at once (an API call, the CLI) once its rows are
        committed. A failure is logged, never raised: the work is stored, the recovery sweep
        publishes it when the broker is back (see :meth:`recover`), and an error answer would
        invite a retry that starts it twice."""
        try:
            self.dispatcher.publish(dispatches)
        except Exception as exc:
            log.error(
                "%s is stored but its message could not be published (%s); the recovery sweep "
                "sends it once the broker is back: check CONVEYOR_BROKER_URL",
                what,
                exc,
            )

    def _publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        if not dispatches:
            return
        try:
            self.dispatcher.publish(dispatches, batch=batch)
        except Exception:
            # The jobs stay committed as queued. Nothing re-publishes them yet: that is the
            # recovery sweep's work (durability issue). The error is logged loudly meanwhile.
            log.exception("publishing %d job(s) failed; they stay queued", len(dispatches))
