"""The embedded default: SQLite, the in-process broker and Celery worker threads, all inside
the ``conveyor`` process, so that a newcomer sees workflows run with one command.

It runs the same tasks, engine and store as production; only the transport and the pool
differ (``memory://`` and a threads pool instead of Redis and prefork processes). What celery
beat sends in production (the cron check, the recovery and retention sweeps) runs on a duty
thread of the long-running embedded processes, ``conveyor api`` and ``conveyor worker``
(:func:`embedded_beat`); a short command (``conveyor run``) does not run it, since it would
start work it cannot wait for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from conveyor import wiring
from conveyor.config import archive_retention, get_settings
from conveyor.engine.queues import ALL_QUEUES, NODE_QUEUE
from conveyor.scheduler.duty_thread import Duty, Maintenance

log = logging.getLogger("conveyor.embedded")
# How long a stopped embedded worker's consumer loop is given to end (see embedded_workers).
_LOOP_GRACE = 0.1


@contextmanager
def embedded_workers(concurrency: int | None = None) -> Iterator[Any]:
    """Start a Celery worker (threads pool) serving all four queues; stop it on exit."""
    from conveyor.tasks import app  # the process's app, with the tasks registered on it

    settings = get_settings()
    worker = app.WorkController(
        pool_cls="threads",
        concurrency=concurrency or settings.embedded_workers,
        queues=list(ALL_QUEUES),
        loglevel="WARNING",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        hostname="embedded@conveyor",
        ready_callback=None,
    )
    ready = threading.Event()
    thread = threading.Thread(
        target=_run, args=(worker, ready), daemon=True, name="conveyor-worker"
    )
    thread.start()
    ready.wait(10)
    try:
        yield worker
    finally:
        # stop() returns once the pool's threads have finished what they ran (the threads
        # pool shuts its executor down, waiting). The consumer's loop then notices only when
        # its poll of the in-memory broker times out, up to 2 s later (Celery's synloop
        # drains with timeout=2.0): waiting for that made every embedded command take 2 s
        # longer to exit. The loop's thread is a daemon and runs nothing more.
        worker.stop(in_sighandler=False)
        thread.join(timeout=_LOOP_GRACE)


def _run(worker: Any, ready: threading.Event) -> None:
    try:
        ready.set()
        worker.start()
    except Exception:  # a worker crash must not leave the CLI hanging silently
        log.exception("the embedded worker stopped")


@contextmanager
def embedded_beat() -> Iterator[Maintenance]:
    """Run what celery beat sends in production on a duty thread here, each at its interval:
    the cron check (CONVEYOR_SCHEDULE_CHECK_INTERVAL), the recovery sweep
    (CONVEYOR_RECOVER_INTERVAL) and the retention sweep (CONVEYOR_RETENTION_INTERVAL). The
    runs they start go to this process's broker, so its embedded workers must be running."""
    maintenance = Maintenance(beat_duties())
    maintenance.start()
    try:
        yield maintenance
    finally:
        maintenance.stop()


def beat_duties() -> list[Duty]:
    settings, service = get_settings(), wiring.service()

    def recover() -> int:
        done = service.recover(
            heartbeat_timeout=settings.heartbeat_timeout,
            lost_after=settings.lost_after,
            broker_holds=lambda: memory_holds({NODE_QUEUE: settings.batch_most}),
        )
        return sum(done.values())

    def prune() -> int:
        if not settings.retention_days:
            return 0
        return service.prune(
            timedelta(days=settings.retention_days),
            archive_older_than=archive_retention(settings.archive_retention_days),
        )

    return [
        Duty(name="schedules", run=service.check_schedules,
             interval=settings.schedule_check_interval),
        Duty(name="recover", run=recover, interval=settings.recover_interval),
        Duty(name="prune", run=prune, interval=settings.retention_interval),
    ]  # fmt: skip


def memory_holds(jobs_per_message: Mapping[str, int]) -> dict[str, int]:
    """Jobs the in-process broker may hold waiting, per queue (its messages times the most
    jobs one message of the queue names), as :func:`conveyor.metrics.broker_holds` counts a
    Redis broker's. The recovery sweep re-sends only the jobs this process's broker cannot
    hold: those of another embedded process that exited (a command stopped before its end),
    not those merely waiting here for a worker thread."""
    from kombu.transport.memory import Channel  # its queues are the process's, shared

    return {
        queue: Channel.queues[queue].qsize() * jobs_per_message.get(queue, 1)
        for queue in ALL_QUEUES
        if queue in Channel.queues
    }
