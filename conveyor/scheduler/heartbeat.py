"""Beat's liveness check: ``python -m conveyor.scheduler.heartbeat`` exits 0 while the file
that beat touches after every tick (``CONVEYOR_BEAT_HEARTBEAT_FILE``) is recent, and 1 with the
reason otherwise. Container health checks and Kubernetes liveness probes run it; it reads
one file's time and connects to nothing (not the broker, which a ping would need).

Beat ticks at least as often as its most frequent entry is due (the recovery sweep, every
``CONVEYOR_RECOVER_INTERVAL`` seconds by default) and never less often than every 300 s, so a
file older than twice that, plus a margin for a slow publish, means beat is stuck or gone.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from conveyor.config import Settings, get_settings

# Celery's Scheduler.max_interval: beat ticks at least this often, whatever its entries.
BEAT_MAX_INTERVAL = 300.0
MARGIN = 30.0


def touch(path: Path) -> None:
    """Record one tick: the file's modification time is now."""
    path.touch()


def max_age(settings: Settings) -> float:
    """How old the heartbeat may be while beat is alive, from the intervals it keeps."""
    shortest = min(
        settings.schedule_check_interval,
        settings.recover_interval,
        settings.retention_interval,
        BEAT_MAX_INTERVAL,
    )
    return 2 * shortest + MARGIN


def problem(path: Path, limit: float, now: float | None = None) -> str | None:
    """Why beat does not look alive, or None when its heartbeat is recent enough."""
    try:
        modified = path.stat().st_mtime
    except FileNotFoundError:
        return f"no heartbeat at {path}: beat has not ticked yet, or writes elsewhere"
    age = (time.time() if now is None else now) - modified
    if age > limit:
        return f"beat's heartbeat {path} is {age:.0f} s old (more than {limit:.0f} s): it is stuck"
    return None


def main() -> int:
    settings = get_settings()
    if not settings.beat_heartbeat_file:
        print("CONVEYOR_BEAT_HEARTBEAT_FILE is not set: beat keeps no heartbeat", file=sys.stderr)
        return 1
    reason = problem(Path(settings.beat_heartbeat_file), max_age(settings))
    if reason:
        print(reason, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
