"""The duty thread of every worker's main process: periodic maintenance, one duty at a time.

Duties: promote retry and delay jobs whose time has come (this is why delays never sit in
broker ETAs), age low-priority jobs, sweep the limiter for lapsed leases and lost wake-ups, and
evaluate the alert rules (:mod:`conveyor.alerts`). Each duty is safe to run from any number of
workers at once (``FOR UPDATE SKIP LOCKED`` in PostgreSQL, atomic scripts in Redis, and a
re-send of a lost job claims it for a lapse, so the workers re-send it once between them). A
duty that found work runs again at once.

The prefork pool forks its children from this same process, while this thread may be in the
middle of a duty holding library locks (SQLAlchemy's mapper and pool mutexes, for one). A child
forked then inherits them locked and hangs at its first query. So a fork waits until the duty
in progress has finished (:class:`ForkGuard`), and the thread starts after the pool's first
forks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger("conveyor.maintenance")


@dataclass(frozen=True, kw_only=True)
class Duty:
    name: str
    run: Callable[[], int]  # how many items it handled; more than 0 means run again at once
    interval: float


class ForkGuard:
    """Held while a duty runs; ``os.fork`` in any thread waits for it (up to ``timeout``)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self._lock = threading.Lock()
        self._held_for_fork = False
        self.timeout = timeout
        os.register_at_fork(
            before=self._before_fork,
            after_in_parent=self._after_fork,
            after_in_child=self._after_fork,
        )

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *_: object) -> None:
        self._lock.release()

    def _before_fork(self) -> None:
        self._held_for_fork = self._lock.acquire(timeout=self.timeout)

    def _after_fork(self) -> None:
        if self._held_for_fork:
            self._held_for_fork = False
            self._lock.release()


class Maintenance:
    def __init__(self, duties: Sequence[Duty]) -> None:
        self.duties = list(duties)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._guard = ForkGuard()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="conveyor-maintenance", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        due = {d.name: 0.0 for d in self.duties}
        while not self._stop.is_set():
            for duty in self.duties:
                now = time.monotonic()
                if due[duty.name] > now:
                    continue
                busy = self._run(duty)
                due[duty.name] = now if busy else now + duty.interval
            self._stop.wait(max(0.0, min(due.values()) - time.monotonic()))

    def _run(self, duty: Duty) -> bool:
        try:
            with self._guard:
                return duty.run() > 0
        except Exception:
            log.exception("maintenance duty %s failed; trying again", duty.name)
            return False
