"""Jobs whose time has come: retries and delays due, low jobs aged to normal."""

from __future__ import annotations

from datetime import datetime, timedelta

from conveyor.engine.ports import Store
from conveyor.engine.ready import dispatch_of
from conveyor.engine.records import (
    Dispatch,
)


def promote_due(store: Store, now: datetime, limit: int = 500) -> list[Dispatch]:
    """Queue the retry and delay jobs whose time has come."""
    return [dispatch_of(j) for j in store.promote_due(now, limit)]


def age_queued(store: Store, now: datetime, age_after: float, limit: int = 500) -> list[Dispatch]:
    """Serve low jobs queued longer than ``age_after`` seconds as normal (re-published)."""
    aged = store.age_queued(now - timedelta(seconds=age_after), limit)
    return [dispatch_of(j) for j in aged]
