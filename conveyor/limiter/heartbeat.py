"""The heartbeat of running node jobs: one thread per process renews every held permit.

A permit's lease is ``permit_lease`` seconds; the keeper renews all of this process's permits
in one call every third of that. A process killed with SIGKILL stops renewing, so its permits
lapse within one lease and the limiter gives them to waiting jobs.
"""

from __future__ import annotations

import logging
import os
import threading

from conveyor.engine.limits import Permit
from conveyor.engine.ports import Limiter

log = logging.getLogger("conveyor.limits")


class LeaseKeeper:
    def __init__(self, limiter: Limiter, lease: float) -> None:
        self.limiter = limiter
        self.interval = lease / 3
        self._held: dict[str, Permit] = {}
        self._lock = threading.Lock()
        self._pid = 0
        self._wake = threading.Event()

    def hold(self, permit: Permit) -> None:
        with self._lock:
            self._held[permit.token] = permit
            if self._pid != os.getpid():  # first use in this process (or after a fork)
                self._pid = os.getpid()
                threading.Thread(target=self._loop, name="conveyor-leases", daemon=True).start()

    def drop(self, permit: Permit) -> None:
        with self._lock:
            self._held.pop(permit.token, None)

    def held(self) -> list[Permit]:
        with self._lock:
            return list(self._held.values())

    def _loop(self) -> None:
        pid = os.getpid()
        while self._pid == pid:
            self._wake.wait(self.interval)
            permits = self.held()
            if not permits:
                continue
            try:
                lapsed = self.limiter.renew(permits)
            except Exception:
                log.warning("renewing %d permit lease(s) failed; trying again", len(permits))
                continue
            for token in lapsed:
                # Lapsed means no heartbeat reached Redis for a whole lease: the permit went
                # to another job, and this one now runs beyond its limit until it ends.
                log.error("permit %s lapsed while its job ran; raise CONVEYOR_PERMIT_LEASE", token)
                with self._lock:
                    self._held.pop(token, None)
