"""Periodic maintenance inside every worker's main process.

Duties: promote retry and delay jobs whose time has come (this is why delays never sit in
broker ETAs), age low-priority jobs, and sweep the limiter for lapsed leases and lost
wake-ups. Each duty is safe to run from any number of workers at once (``FOR UPDATE SKIP
LOCKED`` in PostgreSQL, atomic scripts in Redis). A duty that found work runs again at once.
"""

from __future__ import annotations

import logging
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


class Maintenance:
    def __init__(self, duties: Sequence[Duty]) -> None:
        self.duties = list(duties)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
            return duty.run() > 0
        except Exception:
            log.exception("maintenance duty %s failed; trying again", duty.name)
            return False
