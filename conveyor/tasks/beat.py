"""The scheduler ``celery beat`` runs: Celery's in-memory one (schedules live in the database;
beat's own state is only when it last sent each check), plus a heartbeat file touched after
every tick for a liveness check (:mod:`conveyor.scheduler.heartbeat`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from celery.beat import Scheduler

from conveyor.scheduler.heartbeat import touch

log = logging.getLogger("conveyor.beat")


class HeartbeatScheduler(Scheduler):
    """Celery's Scheduler that touches ``CONVEYOR_BEAT_HEARTBEAT_FILE`` (when set) after each
    tick, so that a health check tells a beat that ticks from one that hangs."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval: float = super().tick(*args, **kwargs)
        heartbeat = self.app.conf.get("conveyor_beat_heartbeat_file")
        if heartbeat:
            try:
                touch(Path(heartbeat))
            except OSError as exc:
                # Sending the checks matters more than the heartbeat: beat goes on, and its
                # health check reports the missing file.
                log.warning("beat cannot touch its heartbeat file %s: %s", heartbeat, exc)
        return interval
