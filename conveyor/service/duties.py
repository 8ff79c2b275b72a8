"""The workers' periodic duties: promote due jobs, age low ones, check schedules, recover lost
and stalled work, prune old executions, sweep the limiter."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from conveyor import tracing
from conveyor.engine import (
    children,
    due,
    failure,
    ready,
    subscriptions,
    waits,
)
from conveyor.engine.queues import may_hold
from conveyor.engine.records import AfterCommit, Dispatch
from conveyor.engine.states import JobKind, JobStatus
from conveyor.scheduler import schedules
from conveyor.service.base import ServiceBase, log, utcnow
from conveyor.store import SqlStore


class Duties(ServiceBase):
    """The maintenance a worker process runs on its duty thread (or Celery beat triggers)."""

    def promote_due(self, limit: int = 500) -> int:
        """Publish the retry and delay jobs whose time has come, and settle the waits whose
        timeout has come (:meth:`expire_waits`); how many jobs were published."""
        dispatches = self.db.run(lambda s: due.promote_due(s, utcnow(), limit))
        self._publish(dispatches)
        self.expire_waits(limit)
        return len(dispatches)

    def expire_waits(self, limit: int = 500) -> int:
        """The wait nodes whose timeout has come settled: their ``on_timeout`` branch taken,
        or failed (see :func:`conveyor.engine.waits.expire_waits`); how many."""
        settled, after = self.db.run(lambda s: waits.expire_waits(s, utcnow(), limit))
        self._after(after)
        if settled:
            log.info("%d wait(s) timed out", settled)
        return settled

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
                lambda s: schedules.check_due(
                    s, utcnow(), limit=batch, grace=self.misfire_grace, traced=tracing.fire_spans
                )
            )
            self._publish(checked.dispatches)
            started += len(checked.dispatches)
            if checked.claimed < batch:
                return started

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
        - ``waits_settled``: parents' nodes still waiting on a child that has finished
          (none should be: the child's finish settles its parent's node), settled as the
          child's finish would have;
        - ``children_stopped``: children still running that their parent no longer waits
          for, stopped (a failure stopped a tree wider than its transaction's share, whose
          worker died before it stopped the rest; or a cancel's process ended midway);
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
            failed = [
                failure.reclaim(store, job, now, self._rng, output_bytes=self.bounds.output_bytes)
                for job in stale
            ]
            store.count_recovered("reclaimed", len(failed))
            return failed

        reclaimed = self.db.run(reclaim)
        for failed in reclaimed:
            self._after(failed.after)
        settled = self._settle_waits(now, batch)
        orphans = self._stop_orphans(recovered=True)
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
        done = {
            "reclaimed": len(reclaimed), "republished": len(lost), "waits_settled": settled,
            "children_stopped": orphans,
        }  # fmt: skip
        if any(done.values()):
            log.warning("recovery: %s", ", ".join(f"{k} {v}" for k, v in done.items() if v))
        return done

    def _settle_waits(self, now: datetime, batch: int) -> int:
        """Parents' nodes still waiting on a child that has finished, settled: none should be
        (the child's finish settles its parent's node in the same transaction)."""

        def settle(store: SqlStore) -> tuple[int, AfterCommit]:
            settled, after = children.settle_waiting(store, now, batch)
            store.count_recovered("waits_settled", settled)
            return settled, after

        settled, after = self.db.run(settle)
        self._after(after)
        return settled

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
        # events kept for waits past their retention, and the rows of waits stopped
        if dropped := self._in_batches(lambda s: s.drop_expired_events(now, batch), batch, most):
            log.info("retention: %d expired event(s) deleted", dropped)
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
