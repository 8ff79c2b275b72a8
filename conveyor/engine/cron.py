"""Cron expressions in a timezone, and what a due schedule fires. Pure: no session, no clock.

Parsing and fire times come from cronsim, which follows Debian cron on DST days:

- a time that falls in the hour skipped when clocks go forward runs once, at the first
  minute after the gap (``30 2 * * *`` runs at 03:00 that day);
- a time that occurs twice when clocks go back runs once, at its first occurrence;
- an expression whose minute or hour field starts with ``*`` (``*/15 * * * *``,
  ``0 * * * *``) follows real elapsed time: an hourly job runs 23 times on a spring-forward
  day and 25 times on a fall-back day, never twice in the same real hour.

Every time this module returns is timezone-aware UTC, which is what the database stores.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

from conveyor.exceptions import ScheduleError

NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIELDS = "minute hour day-of-month month day-of-week"
# Missed slots are counted (for the log) up to this many: counting walks them one by one, and
# a long downtime of an every-minute schedule has hundreds of thousands.
COUNT_LIMIT = 100


class MisfirePolicy(StrEnum):
    """What a schedule does with the slots that passed while nothing checked it."""

    ONCE = "once"  # start one run, for the latest missed slot (the default)
    SKIP = "skip"  # start none; a slot runs only if checked within the grace time
    ALL = "all"  # start a run for each missed slot, the latest `catch_up` of them at most


@dataclass(frozen=True)
class Cron:
    """A valid cron expression read in an IANA timezone."""

    expression: str
    timezone: str

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, moment: datetime) -> datetime:
        """The first fire time strictly after ``moment``."""
        for fire in CronSim(_expanded(self.expression), moment.astimezone(self.zone)):
            at = fire.astimezone(UTC)
            if at > moment:  # a first occurrence of a repeated hour can lie behind us
                return at
        raise ScheduleError(f"cron expression {self.expression!r} never fires")  # pragma: no cover

    def latest(self, moment: datetime, since: datetime, count: int) -> list[datetime]:
        """Up to ``count`` fire times in ``[since, moment]``, newest first."""
        # Add in UTC, then convert: adding to a local time would reset its fold, reading the
        # second 01:xx of a fall-back night as the first, an hour earlier.
        start = (moment.replace(microsecond=0) + timedelta(seconds=1)).astimezone(self.zone)
        found: list[datetime] = []
        for fire in CronSim(_expanded(self.expression), start, reverse=True):
            at = fire.astimezone(UTC)
            if at < since or len(found) == count:
                break
            if at <= moment:
                found.append(at)
        return found

    def describe(self) -> str:
        """The expression in words ("At 09:00 on weekdays"), as cronsim explains it."""
        return CronSim(_expanded(self.expression), datetime.now(UTC)).explain()


@lru_cache(maxsize=4096)
def parse_cron(expression: str, timezone: str) -> Cron:
    """A :class:`Cron`, or :class:`ScheduleError` saying what is wrong and how to fix it."""
    problems = cron_problems(expression, timezone)
    if problems:
        raise ScheduleError("; ".join(problems))
    return Cron(" ".join(expression.split()), timezone)


def cron_problems(expression: str, timezone: str) -> list[str]:
    """Every problem with an expression and a timezone; empty when both are valid."""
    return [p for p in (expression_problem(expression), timezone_problem(timezone)) if p]


def expression_problem(expression: str) -> str | None:
    """Why a cron expression is invalid, or None."""
    fields = _expanded(expression).split()
    if len(fields) != 5:
        return (
            f"cron expression {expression!r} has {len(fields)} field(s); write five "
            f"({FIELDS}), e.g. '0 9 * * 1-5', or a nickname such as @daily"
        )
    try:
        next(CronSim(" ".join(fields), datetime(2000, 1, 1, tzinfo=UTC)))
    except CronSimError as exc:
        return f"cron expression {expression!r} is invalid: {exc} (the fields are {FIELDS})"
    except StopIteration:
        return f"cron expression {expression!r} never fires; check its day and month fields"
    return None


def timezone_problem(timezone: str) -> str | None:
    """Why a timezone name is not a usable IANA zone, or None."""
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        close = difflib.get_close_matches(timezone, sorted(available_timezones()), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            f"unknown timezone {timezone!r}{hint}; use an IANA name such as "
            f"'Europe/Paris', 'America/New_York' or 'UTC'"
        )
    return None


def _expanded(expression: str) -> str:
    stripped = expression.strip()
    return NICKNAMES.get(stripped.lower(), stripped)


@dataclass(frozen=True, kw_only=True)
class FirePlan:
    """What one check does with one due schedule."""

    fire_at: tuple[datetime, ...]  # the slots to start a run for, oldest first
    next_run_at: datetime  # the first slot after the check
    missed: int  # slots that passed and start no run (counted up to about COUNT_LIMIT)


def plan_fires(
    cron: Cron,
    *,
    due: datetime,
    now: datetime,
    policy: MisfirePolicy,
    catch_up: int,
    grace: float,
) -> FirePlan:
    """The runs a check at ``now`` starts for a schedule whose earliest unfired slot is ``due``.

    On time (one slot passed, checked within ``grace`` seconds of it) every policy fires that
    slot. After downtime, ``policy`` decides: ``once`` fires the latest slot, ``skip`` fires
    nothing older than the grace time, ``all`` fires each, the latest ``catch_up`` at most.
    """
    following = cron.next_after(due)
    if following > now:  # the common case: only ``due`` has passed
        passed, next_run_at = [due], following
    else:  # after downtime: one walk back from now finds the slots to fire and counts the rest
        passed = cron.latest(now, due, max(catch_up, COUNT_LIMIT))  # newest first
        next_run_at = cron.next_after(now)
    slots = passed[: catch_up if policy is MisfirePolicy.ALL else 1][::-1]
    if policy is MisfirePolicy.SKIP:
        slots = [s for s in slots if (now - s).total_seconds() <= grace]
    return FirePlan(fire_at=tuple(slots), next_run_at=next_run_at, missed=len(passed) - len(slots))
