"""Moves retry and delay jobs from the database to the broker when their time comes.

Every worker runs one in its main process; the claim uses ``FOR UPDATE SKIP LOCKED`` so any
number of them cooperate. This is why delays never sit in broker ETAs.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

log = logging.getLogger("conveyor.promoter")


class Promotes(Protocol):
    def promote_due(self, limit: int = 500) -> int: ...


class Promoter:
    def __init__(self, service: Promotes, interval: float) -> None:
        self.service = service
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="conveyor-promoter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.service.promote_due() > 0
            except Exception:
                log.exception("promoting due jobs failed; trying again")
                busy = False
            if not busy:
                self._stop.wait(self.interval)
