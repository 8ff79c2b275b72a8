"""Celery entry points. ``celery -A conveyor.tasks worker -Q workflow-execution,workflow-node``.

Each task decodes its message (a job id), calls the service, and returns. Logic lives in
:mod:`conveyor.engine`; a malformed message is logged and dropped. The app and the service
come from the composition root, :mod:`conveyor.wiring`.
"""

from __future__ import annotations

import gc
import logging
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from celery import bootsteps
from celery.apps.worker import Worker as CeleryWorker
from celery.exceptions import Retry
from celery.signals import (
    beat_init,
    celeryd_init,
    setup_logging,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)
from sqlalchemy.orm import configure_mappers

from conveyor import logs, metrics, tracing, wiring
from conveyor.config import archive_retention, get_settings
from conveyor.engine.queues import NODE_QUEUE
from conveyor.engine.states import JobStatus
from conveyor.exceptions import DeadLettered, LimitError, Snoozed, TryFailed, TryReclaimed
from conveyor.scheduler.duty_thread import Duty, Maintenance
from conveyor.service.workers import Ran
from conveyor.tasks.dispatch import decode_hints

log = logging.getLogger("conveyor.tasks")

app = wiring.celery_app()


def _job_id(raw: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        log.error("dropping a message whose job id is not a UUID: %.80r", raw)
        return None


@app.task(name="conveyor.execution.start", ignore_result=True)
def start_execution(job_id: str) -> None:
    """Plan an execution and enqueue its root nodes."""
    if (parsed := _job_id(job_id)) is not None:
        wiring.service().start_execution(parsed)


# A node task's message is retried with backoff while the limiter (Redis) is unreachable. A
# dead letter is an expected failure: logged in a line, without a traceback.
_NODE_TASK: dict[str, Any] = {
    "ignore_result": True,
    "throws": (DeadLettered, TryReclaimed),
    "autoretry_for": (LimitError,),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "max_retries": None,
}


@app.task(name="conveyor.node.run", **_NODE_TASK)
def run_node(job_id: str, hints: Any = None) -> str | None:
    """Run one node and enqueue the successors it makes ready. While the limiter (Redis) is
    unreachable the message is retried with backoff, the job untouched."""
    if (parsed := _job_id(job_id)) is not None:
        return report([wiring.service().run_node(parsed, decode_hints(hints))])
    return None


@app.task(name="conveyor.node.run_many", **_NODE_TASK)
def run_many(job_ids: Any, hints: Any = None) -> str | None:
    """Run several node jobs one after another, each as :func:`run_node` runs one; those not
    started when the batch has run for its budget are handed back, one a message."""
    if not isinstance(job_ids, list):
        log.error("dropping a batch message whose job ids are not a list: %.80r", job_ids)
        return None
    hinted = hints if isinstance(hints, list) and len(hints) == len(job_ids) else []
    members = [
        (parsed, decode_hints(hinted[i]) if hinted else None)
        for i, raw in enumerate(job_ids)
        if (parsed := _job_id(raw)) is not None
    ]
    ran = wiring.service().run_nodes(members, get_settings().batch_budget)
    shown = report(ran)
    handed_back = len(members) - len(ran)
    return f"{shown}; {handed_back} handed back" if handed_back else shown


_SHOWN = {
    JobStatus.COMPLETED: "completed",
    JobStatus.CANCELLED: "cancelled: its execution was stopped",
    JobStatus.PARKED: "parked until a permit is free, or not runnable any more",
    JobStatus.WAITING_CHILD: "waiting for its child execution (no worker slot held)",
    JobStatus.WAITING_EVENT: "waiting for its event (no worker slot held)",
    None: "dropped: its job was not queued any more",
}


def report(ran: Sequence[Ran]) -> str:
    """What a node message's task reports, once every outcome is committed, so that Flower
    shows the truth: FAILURE with the node's error when a job was dead-lettered
    (:class:`DeadLettered`), or when its try failed after recovery had reclaimed the job
    (:class:`TryReclaimed`: recovery runs it again); RETRY when a try will be retried
    (Celery's ``Retry``, raised, never ``self.retry``: nothing is published, the job waits in
    the database), or when a node snoozed (the same, with :class:`Snoozed`: no try failed);
    else SUCCESS (a node that cancelled its execution says so, with its reason), the result
    saying what became of each job. Either way the message is acked
    (``task_acks_on_failure_or_timeout``, see tasks/app.py), so raising never redelivers it."""
    several = len(ran) > 1

    def errors(outcome: JobStatus | None, reclaimed: bool = False) -> str:
        failed = [r for r in ran if r.outcome is outcome and r.reclaimed is reclaimed]
        return "; ".join(f"{r.name}: {r.error}" if several else r.error for r in failed)

    if dead := errors(JobStatus.DEAD_LETTER):
        raise DeadLettered(dead)
    if reclaimed := errors(None, reclaimed=True):
        raise TryReclaimed(f"failed; its job was reclaimed by recovery: {reclaimed}")
    if retried := errors(JobStatus.RETRY_WAIT):
        waiting = [r for r in ran if r.outcome is JobStatus.RETRY_WAIT]
        soonest = min(r.retry_in or 0.0 for r in waiting)
        if all(r.snoozed for r in waiting):  # no try failed: each node asked to wait
            raise Retry(f"runs again in {soonest:.1f}s: {retried}", exc=Snoozed(retried))
        raise Retry(f"tried again in {soonest:.1f}s: {retried}", exc=TryFailed(retried))
    shown = [r.error if r.by_node else _SHOWN.get(r.outcome, str(r.outcome)) for r in ran]
    return (
        "; ".join(f"{r.name}: {s}" for r, s in zip(ran, shown, strict=True))
        if several
        else (shown[0] if shown else "nothing ran")
    )


@app.task(name="conveyor.webhook.deliver", ignore_result=True)
def deliver_webhook(delivery_id: str) -> None:
    """Start the workflows a stored webhook delivery matches."""
    if (parsed := _job_id(delivery_id)) is not None:
        wiring.service().deliver_webhook(parsed)


@app.task(name="conveyor.scheduled.promote", ignore_result=True)
def promote_due() -> int:
    """Publish retry and delay jobs whose time has come (also done by every worker)."""
    return wiring.service().promote_due()


@app.task(name="conveyor.scheduled.check", ignore_result=True)
def check_schedules() -> int:
    """Start the runs of the cron schedules whose time has come (sent by celery beat)."""
    return wiring.service().check_schedules()


@app.task(name="conveyor.scheduled.recover", ignore_result=True)
def recover() -> dict[str, int]:
    """The recovery sweep (sent by beat): reclaim jobs of dead workers, re-publish lost
    messages; then promote due retries and sweep the limiter, as every worker does too."""
    settings = get_settings()
    done = wiring.service().recover(
        heartbeat_timeout=settings.heartbeat_timeout,
        lost_after=settings.lost_after,
        # a RabbitMQ queue found missing is declared again, for the re-published to land in
        broker_holds=lambda: metrics.broker_holds(
            settings.resolved_broker_url,
            {NODE_QUEUE: settings.batch_most},
            repair=list(app.amqp.queues.values()),
        ),
    )
    wiring.service().promote_due()
    wiring.service().sweep_limits()
    return done


@app.task(name="conveyor.scheduled.prune", ignore_result=True)
def prune() -> int:
    """The retention sweep (sent by beat): delete old finished executions."""
    settings = get_settings()
    if not settings.retention_days:
        return 0
    return wiring.service().prune(
        timedelta(days=settings.retention_days),
        archive_older_than=archive_retention(settings.archive_retention_days),
    )


class MaintenanceStep(bootsteps.StartStopStep):
    """Runs the maintenance thread inside every worker's main process; the blueprint starts
    it (after the pool has forked its children) and stops it on warm and cold shutdown."""

    requires = ("celery.worker.components:Pool",)

    def create(self, parent: Any) -> Maintenance:  # type: ignore[override]
        settings, svc = get_settings(), wiring.service()
        duties = [
            Duty(name="promote", run=svc.promote_due, interval=settings.promote_interval),
            Duty(name="age", run=svc.age_queued, interval=min(10.0, settings.age_low_after / 4)),
        ]
        if svc.gate is not None:
            duties.append(
                Duty(name="limits", run=svc.sweep_limits, interval=settings.limits_sweep_interval)
            )
        alerter = wiring.alerter(svc)
        duties.append(
            Duty(name="alerts", run=alerter.run, interval=min(10.0, settings.alert_interval))
        )
        return Maintenance(duties)


app.steps["worker"].add(MaintenanceStep)


@setup_logging.connect
def _on_setup_logging(loglevel: Any = logging.INFO, **_: Any) -> None:
    # Connected, this replaces Celery's own logging set-up: every record becomes one JSON line.
    logs.configure(get_settings().log_format, loglevel or logging.INFO)


@celeryd_init.connect
def _on_worker_starting(options: dict[str, Any] | None = None, **_: Any) -> None:
    # `celery worker` checks its privileges (a SecurityWarning as root) before it sets up its
    # logging: set ours up already, so that the warning is a record like the others.
    logs.configure(get_settings().log_format, (options or {}).get("loglevel") or logging.INFO)


@worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    wiring.load_imports()
    # CONVEYOR_APPLY_MODULES: the flows it stores before it serves (embedded workers too:
    # their commands migrate first)
    wiring.apply_modules()
    # Configure the ORM mappers now, in one thread, before any fork: configuring takes a
    # global lock that a child forked mid-way would inherit held.
    configure_mappers()
    # Everything loaded so far lives as long as the worker: out of the collector's sight
    # (Python's advice before a fork), the pool's children do not copy the pages that a
    # collection would write to, their collections skip it, and the interpreter's last
    # collection at exit does not walk it: that one cost a stopping worker seconds of CPU.
    # Only in a `celery worker` process of its own: a worker inside another process (the
    # embedded default's, a test's) would freeze that process's objects, garbage to come
    # included, for good.
    if isinstance(sender, CeleryWorker):
        gc.freeze()


@beat_init.connect
def _on_beat_init(**_: Any) -> None:
    # As a worker's: beat's last collection at exit took seconds of CPU walking its modules.
    gc.freeze()


@worker_process_init.connect
def _on_process_init(**_: Any) -> None:
    # A forked pool process must not share the parent's database connections.
    wiring.database().engine.dispose(close=False)
    wiring.load_imports()


@worker_process_shutdown.connect
def _on_process_shutdown(**_: Any) -> None:
    # A pool process ends without the interpreter's exit handlers: its buffered spans go now.
    tracing.flush()
