"""Absolute times a definition gives (a delay's ``until``): an ISO 8601 time, read in the
timezone the definition names when it carries no offset of its own."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo

from conveyor.engine import bounds
from conveyor.engine.cron import timezone_problem
from conveyor.exceptions import NonRetryableError

FORM = 'an ISO 8601 time, e.g. "2026-12-01T09:00" or "2026-12-01T09:00:00+01:00"'


def zone(name: object) -> tzinfo:
    """The IANA zone ``name`` (None: UTC), or :class:`NonRetryableError` naming the fix."""
    if name is None:
        return UTC
    if not isinstance(name, str) or (problem := timezone_problem(name)):
        shown = bounds.shown(name)
        raise NonRetryableError(
            f"config.timezone {shown} is not a timezone"
            + (f": {problem}" if isinstance(name, str) and problem else "")
            + '; give an IANA name, e.g. "Europe/Paris"'
        )
    return ZoneInfo(name)


def instant(value: object, timezone: object = None) -> datetime:
    """The moment ``value`` (a rendered ``until``: an ISO 8601 time, or a datetime) names, in
    ``timezone`` when it carries no offset; :class:`NonRetryableError` naming the fix."""
    where = zone(timezone)
    if isinstance(value, datetime):
        at = value
    elif isinstance(value, str):
        try:
            at = datetime.fromisoformat(value.strip())
        except ValueError as exc:
            raise NonRetryableError(
                f"config.until rendered to {bounds.shown(value)}, which is not a time; give {FORM}"
            ) from exc
    else:
        raise NonRetryableError(
            f"config.until rendered to {bounds.shown(value)}, which is not a time; give {FORM}"
        )
    return (at if at.tzinfo is not None else at.replace(tzinfo=where)).astimezone(UTC)
