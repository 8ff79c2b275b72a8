"""The embedded default: SQLite, the in-process broker and Celery worker threads, all inside
the ``conveyor`` process, so that a newcomer sees workflows run with one command.

It runs the same tasks, engine and store as production; only the transport and the pool
differ (``memory://`` and a threads pool instead of Redis and prefork processes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conveyor.config import get_settings
from conveyor.engine.queues import ALL_QUEUES

log = logging.getLogger("conveyor.embedded")


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
        worker.stop(in_sighandler=False)
        thread.join(timeout=10)


def _run(worker: Any, ready: threading.Event) -> None:
    try:
        ready.set()
        worker.start()
    except Exception:  # a worker crash must not leave the CLI hanging silently
        log.exception("the embedded worker stopped")
