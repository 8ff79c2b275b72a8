"""A trigger that starts later: its ``run_at`` or ``delay`` checked and made one start time.
The execution is stored at once (pending, its ``scheduled_for`` the start time) and its start
job waits in the database (``scheduled``, ``next_run_at``) until promoted, as a delay node's
job does: never a broker ETA."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from conveyor.engine.bounds import MAX_DELAY_SECONDS
from conveyor.exceptions import StartTimeError

# A run_at this far in the past is taken as now (clocks differ a little); further is refused.
PAST_GRACE = timedelta(seconds=60)
# The latest start a trigger (or a requeue) may ask for: as far as a delay node may wait.
MAX_START_DELAY = timedelta(seconds=MAX_DELAY_SECONDS)


def start_time(
    now: datetime, *, run_at: datetime | None = None, delay: float | None = None
) -> datetime | None:
    """When to start: ``run_at``, or ``delay`` seconds from ``now``; None to start now (no
    time given, a delay of 0, or a ``run_at`` not after ``now`` within the grace).
    :class:`StartTimeError` for a naive ``run_at``, one in the past beyond the grace, a
    negative or non-finite delay, both given, or a start beyond :data:`MAX_START_DELAY`."""
    if run_at is not None and delay is not None:
        raise StartTimeError("give either run_at or delay, not both")
    if delay is not None:
        if not math.isfinite(delay) or delay < 0:
            raise StartTimeError(f"delay must be a number of seconds, 0 or more (got {delay!r})")
        if delay > MAX_START_DELAY.total_seconds():
            raise StartTimeError(
                f"delay {delay:g} s is beyond the bound of {MAX_START_DELAY.days} days; "
                f"start it nearer"
            )
        return now + timedelta(seconds=delay) if delay > 0 else None
    if run_at is None:
        return None
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise StartTimeError(
            f"run_at {run_at.isoformat()} has no UTC offset; give an aware time, "
            f"e.g. {run_at.isoformat()}+00:00"
        )
    if run_at < now - PAST_GRACE:
        raise StartTimeError(
            f"run_at {run_at.isoformat()} is in the past (now is {now.isoformat()}); "
            f"give a future time, or none to start now"
        )
    if run_at - now > MAX_START_DELAY:
        raise StartTimeError(
            f"run_at {run_at.isoformat()} is beyond the bound of {MAX_START_DELAY.days} days "
            f"from now; start it nearer"
        )
    return run_at if run_at > now else None
